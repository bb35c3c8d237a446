"""A frozen base policy plus a learned residual (ResiP, Ankile et al. 2024): ``a = clip(b + clip(scale * r, -limit,
limit), -1, 1)`` with ``b = base.act(obs)`` and ``r = residual.act([obs, b])``, in normalized action units. The
base is any actor ``build_policy`` rebuilds (a BC run, chunked or not; an RL run); its parameters never train."""

from __future__ import annotations

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, build_policy
from embodied.policies.chunked import reset_policy


class ResidualActor(nn.Module):
    spec_name = "residual"

    def __init__(self, base: dict, residual: dict, scale: float = 0.1, limit: float = 0.1):
        super().__init__()
        self.init_kwargs = dict(base=base, residual=residual, scale=scale, limit=limit)
        self.base = build_policy(base).requires_grad_(False).eval()
        self.residual = build_policy(residual)
        self.scale, self.limit = float(scale), float(limit)

    def train(self, mode: bool = True):  # the base stays in eval mode (frozen normalizer and all)
        super().train(mode)
        self.base.eval()
        return self

    @torch.no_grad()
    def base_action(self, obs: torch.Tensor, peek: bool = False) -> torch.Tensor:
        """The base's action; ``peek``: the one it would give, without advancing a chunked base's queues."""
        return self.base.peek(obs) if peek and hasattr(self.base, "peek") else self.base.act(obs)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """New episodes in the envs of ``mask`` (all when None): a chunked base empties their queues."""
        reset_policy(self.base, mask)

    def combine(self, base_action: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return (base_action + (self.scale * residual).clamp(-self.limit, self.limit)).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        b = self.base.act(obs)
        return self.combine(b, self.residual.act(torch.cat([obs, b], -1)))


POLICIES.register("residual", ResidualActor)
