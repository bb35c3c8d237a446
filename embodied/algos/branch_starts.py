"""Episodes started from states the policy itself reached in its last rollout, a group of envs from each: where an
episode failed, the group's episodes from one of its states show which continuations from there succeed.

An episodic learner (``SuccessRollouts``) records every env's exact state before each step of a rollout
(``VecEnv.env_states``, the tasks that can restore one); at the rollout's end the steps of its fresh-start episodes
that failed (``source=failed``; ``all``: every fresh-start episode's) become the candidates, and the next rollout
starts ``fraction`` of its groups each from one candidate drawn uniformly (all of a group's envs from that exact
state, as new episodes with the task's whole step budget). Filtered BC then clones the successes from states where
the policy had failed: its own corrections, in the states it fails in (TRPO's "vine" rollouts branch from visited
states for the same credit; Go-Explore restarts from them). GRPO's groups from one such state compare continuations
of the same situation, so the advantage falls on the actions taken from there on. Evaluation always starts fresh,
and the rollout's success figure counts fresh starts only.

Measured (mini-libero, filtered BC from a 75.4% clone of 10 demonstrations per task, seed 0, 300k steps, fraction 0.5):
episodes from failed states succeeded 10-13% of the time (the clone's failures are systematic, not bad luck), and the
run ended at 60.8% against 70.0% without branch starts: off by default. Replaying only the failed episodes' initial
states (prioritized level replay; tried at stop 57, withdrawn) over the seed-0 ensemble of five clones (filtered-bc
members=5, fraction 0.5): the replayed starts succeeded 47-50% of the time, and the run ended at 66.9% against 86.9%
without (the goal group's plate and tray tasks fell from 100% to ~50%)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from embodied.core.errors import UserError


@dataclass
class BranchStartsConfig:
    fraction: float = 0.0  # of each rollout's groups started from the last rollout's states (0: off)
    source: str = "failed"  # failed: steps of the fresh-start episodes that failed; all: of every fresh-start episode


class BranchStarts:
    """The current rollout's recorded states and the candidates the last rollout left."""

    def __init__(self, cfg: BranchStartsConfig, seed: int):
        self.cfg = cfg  # its source checked with the learner's settings (SuccessRollouts.check)
        self.rows: list[torch.Tensor] = []  # per step of this rollout: [N, S] before the step
        self.candidates = torch.zeros(0, 0, dtype=torch.float64)  # [M, S]
        self.generator = torch.Generator().manual_seed(seed + 15_485_863)

    def record(self, rows: torch.Tensor | None) -> None:
        if rows is None:
            raise UserError("branch_starts.fraction > 0 starts episodes from recorded env states: this task or engine "
                            "cannot record them (VecEnv.env_states; runtime.engine=sync)")
        self.rows.append(rows.to("cpu", torch.float64))

    def close(self, valid: torch.Tensor, episodes: torch.Tensor) -> None:
        """After a rollout: ``valid [T, N]`` (the steps of each env's first episode), ``episodes [N]`` (the envs
        whose episode's steps become candidates). The recorded rows are emptied."""
        if not self.rows:
            return
        states = torch.stack(self.rows[:valid.shape[0]])  # [T, N, S]
        self.rows = []
        take = (valid & episodes[None]).cpu()
        if bool(take.any()):
            self.candidates = states[take]
        else:
            self.candidates = states.new_zeros(0, states.shape[-1])

    def available(self) -> int:
        return int(self.candidates.shape[0])

    def sample(self, k: int) -> torch.Tensor:
        """``[k, S]``: candidates drawn uniformly (with replacement)."""
        pick = torch.randint(self.available(), (k,), generator=self.generator)
        return self.candidates[pick]

    def state_dict(self) -> dict:
        return {"candidates": self.candidates.clone(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping) -> None:
        self.candidates = state["candidates"].clone()
        self.generator.set_state(state["generator"])
