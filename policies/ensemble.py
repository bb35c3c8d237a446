"""Several independently trained actors acting as one: ``act(obs) = 1/K sum_k member_k.act(obs)``, the mean of their
deterministic actions. Independent runs of one learner miss different starts of a task (quadrotor-hover: each of
20 runs fails a different ~3% of 2000 starts, which the union flies but for 1.25%); their action mean flies most of
them. The mean of equivariant members is equivariant. Members are any actors ``build_policy`` rebuilds."""

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
