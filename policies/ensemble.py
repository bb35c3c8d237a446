"""Several independently trained actors acting as one: ``act(obs) = 1/K sum_k member_k.act(obs)``, the mean of their
deterministic actions. Independent runs of one learner miss different starts of a task (quadrotor-hover: each of
20 runs fails a different ~3% of 2000 starts, which the union flies but for 1.25%); their action mean flies most of
them. The mean of equivariant members is equivariant. Members are any actors ``build_policy`` rebuilds.

Where members disagree the mean can cancel to a standstill: mini-libero's stacking task, the 10-demo ensemble of
seed 0 fine-tuned by filtered-bc, holds the cube at the carry height 3-8 mm off the support cube's centre with the
five members' translations there pointing every way (z from -0.11 to +0.14, mean 0.002). Its single members freeze
too (19-27 of their 30-46 failures on 130 starts against the ensemble's 13 of 18; ``bench_pick_failures.py``'s
``froze``), so the mean is not the cause, and other ways of combining did no better on those 130 starts (mean
86.9%): per step the member nearest the others 86.2%, the mean of the members within 0.1 of that one 87.7%, each
env's own member where the mean cancels 86.9%, one member per env 81.5%, the mean plus 0.3 of the members' Gaussian
scale as noise 87.7% (0.6: 79.2%); issue 13, stop 58."""

from __future__ import annotations

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, build_policy, policy_spec
from embodied.policies.chunked import reset_policy


class EnsembleActor(nn.Module):
    spec_name = "ensemble"

    def __init__(self, members: list, obs_dim: int | None = None, act_dim: int | None = None):
        """``members``: the actors themselves (a learner's, shared, not copied) or their ``policy_spec``s.
        ``obs_dim`` / ``act_dim`` are the members' (recorded in the spec like every actor's, for readers of specs
        such as a residual's base loader); given, they must match."""
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        modules = [build_policy(m) if isinstance(m, dict) else m for m in members]
        self.members = nn.ModuleList(modules)
        specs = [policy_spec(m) for m in modules]
        dims = {(s["kwargs"].get("obs_dim"), s["kwargs"].get("act_dim")) for s in specs}
        if len(dims) != 1 or (obs_dim, act_dim) not in (*dims, (None, None)):
            raise ValueError(f"ensemble members read / act on {sorted(dims, key=str)}, expected {obs_dim} / {act_dim}")
        (obs_dim, act_dim), = dims
        self.init_kwargs = dict(members=specs, obs_dim=obs_dim, act_dim=act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.stack([m.act(obs) for m in self.members]).mean(0)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        for m in self.members:
            reset_policy(m, mask)


POLICIES.register("ensemble", EnsembleActor)
