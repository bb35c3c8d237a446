"""Episodes started part-way through the demonstrations, the start moving back as the policy succeeds from there:
Backplay (Resnick et al. 2018) and the single-demonstration curriculum of Salimans and Chen (2018, "Learning
Montezuma's Revenge from a single demonstration"). An episodic learner (``SuccessRollouts``) starts ``fraction`` of
each rollout's groups from a state recorded in its dataset (``data=PATH``; ``collect-demos`` records each step's
exact env state for tasks that can restore one, ``VecEnv.env_states``), drawn uniformly from the last ``reach`` of
every demonstration's steps. ``reach`` begins at ``reach_step`` and grows by it after every rollout whose episodes
from demonstration states succeeded at least ``advance_at`` of the time, up to 1 (the demonstrations' first
states). The other groups start fresh, and evaluation always does: the policy is judged on the task's own starts.

What it is for: a policy that rarely succeeds from a fresh start (a clone of one demonstration per task) still
succeeds from the states near a demonstration's end, so a learner of successes (filtered BC, GRPO) has successes
to learn from in the states it meets at every stage of the task, from the last back to the first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from embodied.core.errors import UserError


@dataclass
class DemoStartsConfig:
    fraction: float = 0.0  # of each rollout's groups started from the demonstrations' states (0: off)
    reach_step: float = 0.1  # the window's first size and its growth, as a fraction of each demonstration's steps
    advance_at: float = 0.5  # the success from demonstration states at which the window grows


class DemoStarts:
    """The recorded states of ``path`` and the curriculum's window over them."""

    def __init__(self, cfg: DemoStartsConfig, path: str, seed: int):
        from embodied.datasets import read_env_states

        if not path:
            raise UserError("demo_starts.fraction > 0 starts episodes from the demonstrations' states: give data=PATH")
        data = read_env_states(path)
        self.cfg = cfg
        self.state, self.step, self.length = data["state"], data["step"], data["length"]
        self.reach = cfg.reach_step
        self.generator = torch.Generator().manual_seed(seed + 104_729)

    def eligible(self) -> torch.Tensor:
        """``[M]`` bool: the rows in the window (a step within the last ``reach`` of its demonstration; always its
        last step)."""
        first = torch.floor((1.0 - self.reach) * self.length.double()).long().clamp(max=self.length - 1)
        return self.step >= first

    def sample(self, k: int) -> torch.Tensor:
        """``[k, S]``: states drawn uniformly from the window."""
        rows = self.eligible().nonzero().squeeze(-1)
        pick = torch.randint(rows.numel(), (k,), generator=self.generator)
        return self.state[rows[pick]]

    def update(self, success: torch.Tensor) -> dict[str, float]:
        """After a rollout: the outcomes ``[K]`` of its episodes from demonstration states; grows the window."""
        rate = float(success.float().mean()) if success.numel() else 0.0
        log = {"demo_starts/reach": self.reach, "demo_starts/success": rate}
        if success.numel() and rate >= self.cfg.advance_at:
            self.reach = min(1.0, self.reach + self.cfg.reach_step)
        return log

    def state_dict(self) -> dict:
        return {"reach": self.reach, "generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping) -> None:
        self.reach = float(state["reach"])
        self.generator.set_state(state["generator"])
