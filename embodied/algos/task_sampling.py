"""Rollout tasks drawn by how often the policy fails them (prioritized task sampling, as curriculum learners over a
set of tasks draw them, e.g. Prioritized Level Replay): an episodic learner (``SuccessRollouts``) on a suite of tasks
(``VecEnv.num_tasks``) gives each group of envs its task, drawn with probability

    p_t = (1 - mix) * f_t / sum_u f_u + mix / T

where ``f_t`` is task ``t``'s failure rate over its fresh-start rollout episodes (an exponential average, ``rate``
per rollout; a task's first rollout sets it, and a task not yet seen counts as failing) and ``T`` the suite's size.
The tasks a policy has mastered then take few rollouts (but at least ``mix / T`` each, so none is forgotten unseen),
the ones it fails most take the rest: more episodes where successes are rare, so more of them join what a learner
of successes learns from. Evaluation keeps the task's own (uniform) draw."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from embodied.core.errors import UserError


@dataclass
class TaskSamplingConfig:
    by: str = "uniform"  # uniform: the env draws each episode's task; failures: by the rollouts' failure rates
    mix: float = 0.25  # the share of the draw kept uniform over the suite
    rate: float = 0.2  # the failure rates' exponential-average rate per rollout


class TaskSampler:
    """The suite's failure rates and the draw of each rollout group's task."""

    def __init__(self, cfg: TaskSamplingConfig, num_tasks: int, seed: int, name: str):
        if cfg.by != "failures":
            raise UserError(f"{name}.task_sampling.by is uniform or failures, got {cfg.by!r}")
        if not num_tasks:
            raise UserError(f"{name}.task_sampling.by=failures draws each rollout's tasks from a suite of tasks "
                            "(e.g. mini-libero); this task is one: use task_sampling.by=uniform")
        if not (0 <= cfg.mix <= 1 and 0 < cfg.rate <= 1):
            raise UserError(f"{name}.task_sampling: mix in [0, 1] and rate in (0, 1]; got {cfg.mix}, {cfg.rate}")
        self.cfg, self.name = cfg, name
        self.fail = torch.ones(num_tasks, dtype=torch.float64)  # not yet seen: failing, so it is drawn
        self.seen = torch.zeros(num_tasks, dtype=torch.bool)
        self.generator = torch.Generator().manual_seed(seed + 15_485_863)

    def probabilities(self) -> torch.Tensor:
        """``[T]``: each task's chance in the next draw (uniform where every task fails, or none does)."""
        t = self.fail.numel()
        total = float(self.fail.sum())
        if total <= 0:
            return torch.full((t,), 1.0 / t, dtype=torch.float64)
        return (1.0 - self.cfg.mix) * self.fail / total + self.cfg.mix / t

    def sample(self, groups: int) -> torch.Tensor:
        """``[groups]`` long: a task for each rollout group."""
        return torch.multinomial(self.probabilities(), groups, replacement=True, generator=self.generator)

    def update(self, task: torch.Tensor, success: torch.Tensor) -> dict[str, float]:
        """After a rollout: its fresh-start episodes' tasks ``[K]`` and outcomes ``[K]`` (0/1) update the failure
        rates."""
        if bool((task < 0).any()):
            raise UserError(f"{self.name}.task_sampling.by=failures needs episodes that report their task (the "
                            "outcome's task id); this task reports none")
        t = self.fail.numel()
        task = task.cpu().long()
        count = torch.bincount(task, minlength=t).double()
        failed = torch.bincount(task, weights=1.0 - success.cpu().double(), minlength=t)
        there = count > 0
        now = failed[there] / count[there]  # this rollout's failure rate of each task it played
        old = self.fail[there]
        self.fail[there] = torch.where(self.seen[there], old + self.cfg.rate * (now - old), now)
        self.seen |= there
        p = self.probabilities()
        return {"task_sampling/max_share": float(p.max()), "task_sampling/min_share": float(p.min())}

    def state_dict(self) -> dict:
        return {"fail": self.fail.clone(), "seen": self.seen.clone(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping) -> None:
        self.fail.copy_(state["fail"])
        self.seen.copy_(state["seen"])
        self.generator.set_state(state["generator"])
