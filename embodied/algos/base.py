"""Algorithm contract (DESIGN.md): a handful of verbs; algorithms never step environments."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

Obs = dict[str, torch.Tensor]


@dataclass
class Transition:
    """One batched env step, on the learner device. ``next_obs`` is the observation to bootstrap
    from: the final observation of an episode where it ended, the next one elsewhere."""

    obs: Obs
    action: torch.Tensor  # [N, act_dim]
    reward: torch.Tensor  # [N]
    terminated: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool
    next_obs: Obs


class Algorithm(abc.ABC):
    @abc.abstractmethod
    def act(self, obs: Obs) -> torch.Tensor:
        """Exploration actions ``[N, act_dim]`` for collection."""

    @abc.abstractmethod
    def observe(self, transition: Transition) -> None:
        """Store what collection produced."""

    @abc.abstractmethod
    def update(self) -> dict[str, float]:
        """Learn from what was observed (may do nothing yet); returns scalar metrics."""

    @abc.abstractmethod
    def actor(self) -> nn.Module:
        """The actor whose ``act(obs)`` is the deterministic, exportable policy."""

    @abc.abstractmethod
    def state_dict(self) -> dict: ...

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping) -> None: ...


def critic_obs(obs: Obs) -> torch.Tensor:
    """Asymmetric actor-critic: the critic reads privileged state where the task has it."""
    return obs.get("critic", obs["policy"])


def critic_dim(space) -> int:
    return space["critic"].shape[0] if "critic" in space.spaces else space["policy"].shape[0]
