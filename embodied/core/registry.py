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
    # sim backends (names in SIM_BACKENDS) the task runs on; the first is the default, a task config field
    # ``backend`` may pick another (embodied.sim_backends.base.choose_backend)
    backends: tuple[str, ...]
    success_metric: str | None = None  # key of info["final_info"] that says an episode succeeded
    default_algo: str = "ppo"
    # derive the evaluation config from the training one (e.g. freeze a curriculum so that an
    # evaluation does not depend on how many evaluations came before); None: the same config
    eval_config: Callable[[Any], Any] | None = None
    tags: tuple[str, ...] = field(default=())
    # config overrides the conformance sweep's long seeding rollouts use for a task whose step is costly (a
    # rendered task: shorter episodes, so the rollouts still cross an autoreset in seconds)
    sweep_overrides: dict = field(default_factory=dict)
    # a task learned from another (``wm:<task>``): ``source(env_cfg) -> (task, its env config)`` names the real task
    # that evaluates it (and, where the task learns while training, provides its experience); None: itself
    source: Callable[[Any], tuple[str, Any]] | None = None
    # ``imagination(run_cfg, learner_device, run_dir)``: the second collector of a run that learns its simulator
    # while training (the off-policy runner feeds it every real step), or None to train on the task itself
    imagination: Callable[..., Any] | None = None
    # ``judge(run_cfg, learner_device, imagination) -> score(act, episodes, learner_device) -> float``: a policy's
    # return in the task's model instead of on the real task (``log.keep_best_by=model``), or None where it has none
    judge: Callable[..., Any] | None = None
    # ``expert(env, action_noise=None, target_noise=0.0, seed=0) -> act(obs)``: a scripted demonstrator of the task
    # (``embodied collect-demos``), or None
    expert: Callable[..., Any] | None = None
    # ``model(env_cfg, num_envs, device, seed)``: the task as a differentiable function of its state and the actor's
    # actions (``starts(seed)``, ``rollout(actor, flight, horizon, generator) -> .reward, .margin [H, N], .end``,
    # ``episode_steps``; docs/architecture.md), for a learner that backpropagates through it (algo=apg), or None
    model: Callable[..., Any] | None = None


class TaskRegistry(Registry[TaskSpec]):
    """Tasks by name; a name ``family:rest`` (``wm:<task>``, ``libero:<suite>/<task>``) is resolved by the
    factory registered for ``family`` (``rest -> TaskSpec``), once, then kept like any other task."""

    def __init__(self):
        super().__init__("task")
        self.families: dict[str, tuple[Callable[[str], TaskSpec], str]] = {}  # prefix -> (factory, description)

    def register_family(self, prefix: str, factory: Callable[[str], TaskSpec], description: str) -> None:
        if prefix in self.families or ":" in prefix:
            raise ValueError(f"task family {prefix!r} is already registered or contains ':'")
        self.families[prefix] = (factory, description)

    def get(self, name: str) -> TaskSpec:
        if name in self._entries or ":" not in name:
            return super().get(name)
        prefix, rest = name.split(":", 1)
        if prefix not in self.families:
            known = ", ".join(f"{p}:" for p in sorted(self.families)) or "(none)"
            raise UserError(f"unknown task family {prefix!r} in {name!r}; known families: {known}")
        spec = self.families[prefix][0](rest)  # raises UserError for a name the family does not have
        if spec.name != name:
            raise ValueError(f"task family {prefix!r} built {spec.name!r} for {name!r}")
        return self.register(name, spec)


TASKS = TaskRegistry()
# name -> factory(model, num_envs, device, **kw) -> SimBackend, with ``factory.models`` (the model names it builds);
# each backend subpackage registers itself on import; build through embodied.sim_backends.base.make_backend
SIM_BACKENDS: Registry[Any] = Registry("sim backend")
ALGOS: Registry[Any] = Registry("algorithm")  # name -> Algorithm subclass
ENGINES: Registry[Any] = Registry("runtime engine")  # name -> Collector subclass
POLICIES: Registry[Any] = Registry("policy")
ROBOTS: Registry[Any] = Registry("robot URI scheme")  # scheme -> Robot subclass (embodied.hardware.robot)


def register_task(spec: TaskSpec) -> TaskSpec:
    return TASKS.register(spec.name, spec)


def register_task_family(prefix: str, factory: Callable[[str], TaskSpec], description: str) -> None:
    """Tasks named ``prefix:<rest>`` are built by ``factory(rest) -> TaskSpec`` on first use."""
    TASKS.register_family(prefix, factory, description)
