"""Policy distillation by DAgger (Ross et al. 2011): a student actor regressed onto a frozen teacher's actions on the
states the student itself visits. ``base=`` names the teacher: a run, a bundle, or several runs joined by commas,
whose action mean is the teacher (``EnsembleActor``: the mean of independent runs flies starts each run alone
crashes; distilled, it is one network again, for export and a microcontroller).

Each step, each env acts with the teacher with probability ``beta`` (falling linearly from ``beta_start`` to 0 over
``beta_steps`` env steps), else with the student (deterministic); every visited state is stored with the teacher's
action on it, and the student learns by minibatch MSE (``updates_per_step`` per env step). The student is the task's
TD3 actor (``policy.actor_hidden``, ``policy.symmetrize``), so the run exports like a TD3 run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from embodied.algos.base import OFF_POLICY, Algorithm, BuildContext, Obs, Transition, deterministic_actor
from embodied.algos.optim import FusedAdam, clip_grad_norm_
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS
from embodied.policies import EnsembleActor, build_policy


@dataclass
class DistillConfig:
    lr: float = 1e-3
    batch_size: int = 256
    buffer_size: int = 300_000  # visited states kept (capped at total_steps)
    updates_per_step: float = 0.25  # gradient steps per env step
    beta_start: float = 0.5  # probability that the teacher acts, at step 0
    beta_steps: int = 50_000  # env steps over which it falls to 0 (0: the student acts from the start)
    warmup_steps: int = 2_000  # env steps stored before the first gradient step
    max_grad_norm: float = 1.0


def load_teacher(base: str, obs_dim: int, act_dim: int) -> nn.Module:
    """The teacher of ``base``: one run or bundle, or the action mean of several joined by commas."""
    from embodied.algos.residual import load_base

    paths = [p.strip() for p in base.split(",") if p.strip()]
    if not paths:
        raise UserError("distill needs base=RUN_DIR (or RUN_A,RUN_B,... for their action mean): the teacher")
    policies = []
    for p in paths:
        loaded = load_base(p, obs_dim, act_dim)
        policy = build_policy(loaded["spec"])
        policy.load_state_dict(loaded["state"])
        if hasattr(policy, "chunk"):  # its act() keeps per-env queues: no label for an arbitrary state
            raise UserError(f"distill: the policy at {p} is action-chunked; a teacher must act on each state alone")
        policies.append(policy.requires_grad_(False).eval())
    return policies[0] if len(policies) == 1 else EnsembleActor(policies).eval()


class Distill(Algorithm):
    paradigm = OFF_POLICY
    config_cls = DistillConfig

    @classmethod
    def build(cls, cfg: DistillConfig, ctx: BuildContext) -> Distill:
        if not isinstance(ctx.action_space, gym.spaces.Box) or ctx.image("policy") is not None:
            raise UserError("distill needs continuous actions and state observations")
        if not 0 <= cfg.beta_start <= 1:
            raise UserError(f"distill.beta_start is a probability: in [0, 1], got {cfg.beta_start}")
        obs_dim, act_dim = ctx.obs_space["policy"].shape[0], ctx.action_space.shape[0]
        teacher = load_teacher(ctx.base, obs_dim, act_dim)
        return cls(cfg, ctx, teacher)

    def __init__(self, cfg: DistillConfig, ctx: BuildContext, teacher: nn.Module):
        self.cfg, self.device = cfg, torch.device(ctx.device)
        self.teacher = teacher.to(self.device)
        obs_dim, act_dim = ctx.obs_space["policy"].shape[0], ctx.action_space.shape[0]
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(ctx.seed)
        torch.manual_seed(ctx.seed)
        self.pi = deterministic_actor(ctx.policy, obs_dim, act_dim, ctx.symmetry).to(self.device)
        self._params = list(self.pi.parameters())
        self.opt = FusedAdam([{"params": self._params, "lr": cfg.lr}])
        self.capacity = min(cfg.buffer_size, ctx.total_steps) if ctx.total_steps else cfg.buffer_size
        self.storage = torch.zeros(self.capacity, obs_dim + act_dim, device=self.device)  # [state, teacher action]
        self.obs_dim, self.size, self.pos = obs_dim, 0, 0
        self.num_observed, self.num_updates, self._credit = 0, 0, 0.0

    def beta(self) -> float:
        if self.cfg.beta_steps <= 0:
            return 0.0
        return self.cfg.beta_start * max(0.0, 1.0 - self.num_observed / self.cfg.beta_steps)

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        o = obs["policy"]
        student = self.pi.act(o)
        beta = self.beta()
        if beta <= 0:
            return student
        teacher = self.teacher.act(o)
        pick = torch.rand(o.shape[0], 1, generator=self.generator, device=self.device) < beta
        return torch.where(pick, teacher, student)

    @torch.no_grad()
    def observe(self, tr: Transition) -> None:
        o = tr.obs["policy"]
        rows = torch.cat([o, self.teacher.act(o)], 1)
        self.num_observed += rows.shape[0]
        rows = rows[-self.capacity:]  # a batch larger than the buffer: its newest rows
        n = rows.shape[0]
        idx = (self.pos + torch.arange(n, device=self.device)) % self.capacity
        self.storage[idx] = rows
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        if self.num_observed >= self.cfg.warmup_steps:
            self._credit += o.shape[0] * self.cfg.updates_per_step

    def update(self) -> dict[str, torch.Tensor]:
        metrics: dict[str, torch.Tensor] = {}
        while self._credit >= 1.0:
            self._credit -= 1.0
            idx = torch.randint(self.size, (self.cfg.batch_size,), generator=self.generator, device=self.device)
            rows = self.storage.index_select(0, idx)
            obs, target = rows[:, :self.obs_dim], rows[:, self.obs_dim:]
            loss = ((self.pi(obs) - target) ** 2).sum(1).mean()
            grads = torch.autograd.grad(loss, self._params)
            clip_grad_norm_(grads, self.cfg.max_grad_norm)
            self.opt.step({0: grads})
            self.num_updates += 1
            metrics = {"distill/loss": loss.detach(), "distill/beta": torch.tensor(self.beta())}
        return metrics

    def actor(self) -> nn.Module:
        return self.pi

    def state_dict(self) -> dict:
        return {"pi": self.pi.state_dict(), "opt": self.opt.state_dict(), "storage": self.storage[:self.size].clone(),
                "pos": self.pos, "generator": self.generator.get_state(), "num_observed": self.num_observed,
                "num_updates": self.num_updates, "credit": self._credit}

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.opt.load_state_dict(state["opt"])
        rows = state["storage"]
        self.size = rows.shape[0]
        self.storage[:self.size] = rows.to(self.device)
        self.pos = int(state["pos"])
        self.generator.set_state(state["generator"])
        self.num_observed, self.num_updates = int(state["num_observed"]), int(state["num_updates"])
        self._credit = float(state["credit"])


ALGOS.register("distill", Distill)
