"""Collector contract: the seam between simulation and learning (DESIGN.md, "Collector").

A collector is built from a ``make_env(num_envs, seed) -> VecEnv`` factory (worker processes build
their own envs from it) and hands the runner ``Transition``s on the learner device. Engines (sync,
async, ray) implement the same contract and are registered in ``ENGINES``. Episode statistics are kept
here, in ``EpisodeStats``, and nowhere else (the SB3 adapter and evaluation use it too).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from embodied.algos.base import Obs, Transition
from embodied.core.base import VecEnv

MakeEnv = Callable[[int, int], VecEnv]  # (num_envs, seed) -> VecEnv


@dataclass
class Episodes:
    """Episodes that ended in one step: ``env_ids [K]`` and, per episode, return, length and the
    task's outcome keys (``info["final_info"]``, e.g. ``success``)."""

    env_ids: torch.Tensor
    returns: torch.Tensor
    lengths: torch.Tensor
    outcome: dict[str, torch.Tensor]

    def as_dicts(self) -> list[dict[str, float]]:
        rets, lens = self.returns.tolist(), self.lengths.tolist()
        extra = {k: v.tolist() for k, v in self.outcome.items()}
        return [{"return": rets[j], "length": lens[j], **{k: v[j] for k, v in extra.items()}} for j in range(len(rets))]


class EpisodeStats:
    """Running return and length of every env; ``track`` reports the episodes a step ended."""

    def __init__(self, num_envs: int, device: torch.device | str):
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)  # 1000-step sums, as Monitor
        self.lengths = torch.zeros(num_envs, dtype=torch.long, device=device)

    def reset(self) -> None:
        self.returns.zero_()
        self.lengths.zero_()

    def track(self, reward: torch.Tensor, done: torch.Tensor, final_info: Mapping | None = None) -> Episodes | None:
        self.returns += reward
        self.lengths += 1
        if not bool(done.any()):
            return None
        ids = done.nonzero().squeeze(-1)
        out = Episodes(ids, self.returns[ids], self.lengths[ids],
                       {k: v[ids] for k, v in (final_info or {}).items()})
        self.returns[ids] = 0.0
        self.lengths[ids] = 0
        return out

    def state_dict(self) -> dict:
        return {"episode_return": self.returns.clone(), "episode_length": self.lengths.clone()}

    def load_state_dict(self, state: Mapping) -> None:
        self.returns.copy_(state["episode_return"])
        self.lengths.copy_(state["episode_length"])


class Collector(abc.ABC):
    """Steps ``num_envs`` envs with the learner's ``act`` and returns transitions on ``learner_device``.

    ``obs`` is the observation the next ``step`` acts on (None before ``reset``).
    Engines that simulate ahead may return a transition whose action came from a policy some updates
    older than the newest (``version`` at observing minus at acting); they log it as ``runtime/policy_lag``.
    """

    num_envs: int
    learner_device: torch.device
    single_observation_space: object
    single_action_space: object
    log: dict[str, float]  # latest env log (task terms, metrics) and runtime counters

    @property
    @abc.abstractmethod
    def obs(self) -> Obs | None: ...

    @abc.abstractmethod
    def reset(self, seed: int | None) -> None:
        """Reset every env (``seed`` re-seeds them)."""

    def reset_seeded(self, seeds: torch.Tensor, restore: tuple[torch.Tensor, torch.Tensor] | None = None,
                     tasks: torch.Tensor | None = None) -> None:
        """Reset every env from its own seed (``VecEnv.reset_envs``; a suite's envs each told its task where
        ``tasks`` is given): what episodic learners start rollouts with; ``restore = (env_ids, rows)`` then puts
        those envs into recorded states (``VecEnv.restore_envs``)."""
        from embodied.core.errors import UserError

        raise UserError(f"the {type(self).__name__} engine cannot reset its envs from per-env seeds "
                        "(episodic learners such as grpo): use runtime.engine=sync")

    def env_states(self) -> torch.Tensor | None:
        """``[N, S]`` float64: every env's exact state now (``VecEnv.env_states``), to start envs from later through
        ``reset_seeded(..., restore)``; None where the engine or the task cannot."""
        return None

    @abc.abstractmethod
    def step(self, act: Callable[[Obs], torch.Tensor], version: int = 0) -> Transition:
        """One batched env step with ``act(obs) -> action [N, act_dim]`` on the learner device. ``version``
        counts the learner's updates so far; an engine that acted earlier reports the difference as lag."""

    @abc.abstractmethod
    def pop_episodes(self) -> list[dict[str, float]]:
        """Episodes finished since the last call (``return``, ``length`` and task outcome keys)."""

    def symmetry_group(self):
        """The task's symmetry group (``core/symmetry.py``) or None."""
        return None

    def relabeller(self):
        """The task's relabelling of recorded episodes (``core/relabel.py``) or None."""
        return None

    def layout(self):
        """The task's observation/action layout (``core/layout.py``), or None where the engine has none."""
        return None

    def num_tasks(self) -> int:
        """How many tasks the envs draw from (``VecEnv.num_tasks``): 0 for one task, or where the engine cannot tell
        its envs theirs."""
        return 0

    @abc.abstractmethod
    def state_dict(self) -> dict: ...

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


def to_device(x, device: torch.device):
    """A tensor or a dict of tensors on ``device`` (the one place tensors cross devices)."""
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=True) for k, v in x.items()}
    return x.to(device, non_blocking=True)
