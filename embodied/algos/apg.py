"""Analytic policy gradient (APG; backpropagation through time in a differentiable simulator, Heeg et al. 2024
"Learning quadrotor control from differentiable simulation"): each ``update`` flies ``batch_size`` flights of the
deterministic actor ``horizon`` steps through the task's differentiable model (``TaskSpec.model``) and takes one
gradient step on

    L = mean over flights of  sum_t gamma^t (barrier * relu(barrier_margin - m_t)^2 - r_t)

where ``r_t`` is the task's shaped reward (no floor, no termination) and ``m_t`` the model's differentiable margin to
the termination boundary (< 0 past it; the barrier takes the place of the episode's end, which has no gradient).
A flight starts from the task's own initial distribution (``start_distribution``: by default the one the run is
evaluated on, plants, disturbances and observation noise included) and, unless it crossed the boundary, its episode
is over or it is drawn to restart (``restart``), goes on at the next update from where it stopped.

It runs in the offline runner: no env is stepped, and ``step`` counts the model's steps (``batch_size * horizon``
an update), so a run's ``total_steps`` budgets simulated steps (``ensemble=K``: each member flies its own, and
``step`` counts one member's, as an offline member makes every gradient step). A flight that goes on past the
episode's end (its last update starts before step ``episode_steps`` and runs ``horizon`` on) flies on: the dynamics
are the same, the hold is what it trains there. Its actor is the
TD3 actor (the same spec), so ``init=RUN`` fine-tunes a TD3 run's policy: on quadrotor-hover under domain
randomization the recovery from tilted, falling starts that TD3's critic does not resolve (README)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from embodied.algos.base import OFFLINE, Algorithm, BuildContext, Obs, Transition, deterministic_actor
from embodied.algos.optim import anneal_linear, check_lr_schedule
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS


@dataclass
class APGConfig:
    # from seeds 0-4's 100k TD3 policies, 199,680 model steps, 2000 strict randomized starts: 1e-3 -> 0.9595, 2e-3 ->
    # 0.9612, 2e-3 linear -> 0.960, 3e-3 linear -> 0.9611; with a 256x256 actor (both stages) 1e-3 -> 0.9618, with
    # 256x256x256 0.963 (stop 81)
    lr: float = 1e-3
    lr_schedule: str = "constant"  # constant | linear (to 0 at total_steps, by the model steps flown)
    # flights per update. quadrotor-hover, randomized plants, from seeds 0-4's 200k TD3 policies (0.934 mean on 2000
    # strict starts), 99,840 model steps at restart 0.5: 64 -> 0.950, 32 -> 0.954, 16 -> 0.957, 8 -> ~0.955 (seeds
    # 0-3; twice 16's wall); TD3 alone at 300k env steps: 0.944 (closing note of stop 80)
    batch_size: int = 16
    horizon: int = 60  # model steps flown from each start (0.6 s on quadrotor-hover: its crashes come earlier)
    gamma: float = 0.99
    barrier: float = 1e4  # weight of the squared depth inside the margin band
    barrier_margin: float = 0.1  # the band's width (the model's units: metres from quadrotor-hover's radius)
    max_grad_norm: float | None = 1.0
    # the chance that a flight which could go on (inside the termination radius, its episode not over) starts over
    # at the next update instead; 1: every update flies from fresh starts. Below 1 the batch also covers the later,
    # near-hover part of the episodes (SHAC's continuing rollouts). Same setting as above at batch 64: 1 -> 0.946
    # (2-33 of 2000 starts survive outside the radius: the hold untrained), 0.5 -> 0.950 (0-17), 0.25 -> 0.953
    # Tried at the defaults (same run, stop 81), none above them (0.9567): a crossed flight retrying its own start
    # half the time 0.9559 (nine tenths: 0.934, more flights left hovering outside the radius), the policy a Polyak
    # average of the actor (decay 0.9) 0.9553, both 0.9561, the loss truncated at the first crossing 0.9551
    restart: float = 0.5
    # the starts' distribution: the one the run is evaluated on (eval: quadrotor-hover's strict starts, plants over
    # the whole ranges) or the one the task trains its other learners on (train: its guided starts and hard plants)
    start_distribution: str = "eval"


def discounted_loss(reward: torch.Tensor, margin: torch.Tensor, gamma: float, barrier: float,
                    barrier_margin: float) -> torch.Tensor:
    """``mean_n sum_t gamma^t (barrier relu(barrier_margin - margin[t, n])^2 - reward[t, n])`` of ``[H, N]``
    rollouts."""
    cost = barrier * torch.relu(barrier_margin - margin) ** 2 - reward
    discount = gamma ** torch.arange(reward.shape[0], device=reward.device, dtype=reward.dtype)
    return (discount[:, None] * cost).sum(0).mean()


class APG(Algorithm):
    paradigm = OFFLINE
    config_cls = APGConfig

    @classmethod
    def build(cls, cfg: APGConfig, ctx: BuildContext) -> APG:
        if ctx.model is None:
            raise UserError("apg backpropagates through the task's differentiable model, and this task has none "
                            "(quadrotor-hover has one)")
        return cls(cfg, ctx)

    def __init__(self, cfg: APGConfig, ctx: BuildContext):
        self.cfg, self.device = cfg, torch.device(ctx.device)
        obs_dim, act_dim = ctx.obs_space["policy"].shape[0], ctx.action_space.shape[0]
        torch.manual_seed(ctx.seed)
        self.pi = deterministic_actor(ctx.policy, obs_dim, act_dim, ctx.symmetry).to(self.device)
        if cfg.start_distribution not in ("eval", "train"):
            raise UserError(f"apg.start_distribution is eval or train, got {cfg.start_distribution!r}")
        self.model = ctx.model(cfg.batch_size, cfg.start_distribution)
        self.opt = torch.optim.Adam(self.pi.parameters(), lr=cfg.lr)
        check_lr_schedule("apg.lr_schedule", cfg.lr_schedule)
        self.total_steps = ctx.total_steps
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(ctx.seed)
        self.steps_per_update = cfg.batch_size * cfg.horizon
        self.flight = None  # where the model's flights are (the model's ``Flight``), None before the first update
        self.crossed = None  # [N] bool: the flights of the last update that left the termination boundary
        self.faults = 0  # updates skipped for a non-finite loss (a numerical fault in the model's flights)

    def act(self, obs: Obs) -> torch.Tensor:
        return self.pi.act(obs["policy"])

    def observe(self, transition: Transition) -> None:  # nothing is collected: the model is flown instead
        pass

    def update(self) -> dict[str, float]:
        cfg = self.cfg
        seed = int(torch.randint(2**62, (1,), generator=self.generator, device=self.device))
        fresh = self.model.starts(seed)
        if self.flight is None:
            self.flight = fresh
        else:
            over = (self.flight.steps >= self.model.episode_steps) | self.crossed
            draw = torch.rand(cfg.batch_size, generator=self.generator, device=self.device) < cfg.restart
            self.flight = self.flight.where(over | draw, fresh)
        out = self.model.rollout(self.pi, self.flight, cfg.horizon, self.generator)
        self.flight, self.crossed = out.end.detach(), (out.margin < 0).any(0)
        loss = discounted_loss(out.reward, out.margin, cfg.gamma, cfg.barrier, cfg.barrier_margin)
        if not bool(torch.isfinite(loss)):  # a numerical fault: no step on it, and every flight starts over
            self.faults += 1
            self.flight = None
            return {"apg/faults": float(self.faults)}
        if cfg.lr_schedule == "linear" and self.total_steps:  # by the model steps flown before this update
            anneal_linear(self.opt.param_groups, [cfg.lr], self.num_updates * self.steps_per_update, self.total_steps)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.pi.parameters(), cfg.max_grad_norm or float("inf"))
        self.opt.step()
        self.num_updates += 1
        return {"apg/loss": loss.item(), "apg/grad_norm": grad_norm.item(),
                "apg/crossed": self.crossed.float().mean().item(), "apg/faults": float(self.faults)}

    def actor(self) -> nn.Module:
        return self.pi

    def state_dict(self) -> dict:
        return {"pi": self.pi.state_dict(), "opt": self.opt.state_dict(), "generator": self.generator.get_state(),
                "num_updates": self.num_updates, "flight": self.flight, "crossed": self.crossed, "faults": self.faults}

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.num_updates, self.faults = int(state["num_updates"]), int(state["faults"])
        flight, crossed = state["flight"], state["crossed"]  # a checkpoint is read onto the CPU
        self.flight = type(flight)(*(t.to(self.device) for t in flight.parts())) if flight is not None else None
        self.crossed = crossed.to(self.device) if crossed is not None else None


ALGOS.register("apg", APG)
