"""Registries: the only module-level mutable state (DESIGN.md, "Cross-cutting rules").

A registry is a dict plus ``register``; an unknown name is a ``UserError`` that lists what exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from embodied.core.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UserError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: how to build it and what it runs on."""

    name: str
    make: Callable[..., Any]  # make(cfg, num_envs, device, seed) -> VecEnv
    config_cls: type  # the task's typed config dataclass
    description: str
    backends: tuple[str, ...]
    success_metric: str | None = None  # key of info["final_info"] that says an episode succeeded
    default_algo: str = "ppo"
    # derive the evaluation config from the training one (e.g. freeze a curriculum so that an
    # evaluation does not depend on how many evaluations came before); None: the same config
    eval_config: Callable[[Any], Any] | None = None
    tags: tuple[str, ...] = field(default=())


TASKS: Registry[TaskSpec] = Registry("task")
SIM_BACKENDS: Registry[Any] = Registry("sim backend")
ALGOS: Registry[Any] = Registry("algorithm")
POLICIES: Registry[Any] = Registry("policy")


def register_task(spec: TaskSpec) -> TaskSpec:
    return TASKS.register(spec.name, spec)
