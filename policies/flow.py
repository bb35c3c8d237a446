"""A flow-matching action-chunk head (pi0's action expert, Black et al. 2024; rectified flow, Liu et al. 2022): a
velocity network ``v(o, x, t)`` learns to carry noise ``x_0 ~ N(0, I)`` to a demonstrated chunk ``x_1`` along the
straight path ``x_t = (1 - t) x_0 + t x_1``:

    L = E_{t ~ U(0, 1), x_0} || v(o, x_t, t) - (x_1 - x_0) ||^2

and acting integrates ``dx/dt = v`` from ``t = 0`` to 1 in ``steps`` Euler steps. A regression head averages the
modes of multimodal demonstrations (go left of the cube or right of it); a flow samples one of them.

``act`` (evaluation, export) starts from ``x_0 = 0``, the prior's mode, so it is deterministic; ``sample`` starts
from noise. ``t`` enters through a sinusoidal embedding; at a fixed step it is a constant, so the exported program
folds it into the first layer's bias and unrolls the Euler steps into plain matmuls (``export.program``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, _normalizer
from embodied.policies.chunked import ChunkQueue
from embodied.policies.networks import mlp

TIME_FEATURES = 16


def time_embedding(t: torch.Tensor, features: int = TIME_FEATURES) -> torch.Tensor:
    """``[..., features]``: ``[sin(2 pi f_k t), cos(2 pi f_k t)]`` with ``f_k = 2^k / 2``, ``k < features / 2``."""
    freqs = 2.0 ** torch.arange(features // 2, dtype=t.dtype, device=t.device) / 2.0
    angle = 2.0 * math.pi * t[..., None] * freqs
    return torch.cat([torch.sin(angle), torch.cos(angle)], -1)


class FlowChunkActor(ChunkQueue, nn.Module):
    spec_name = "flow_chunk_mlp"

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], horizon: int = 8, execute: int = 4,
                 steps: int = 10, activation: str = "relu", obs_normalization: bool = False,
                 ensemble: float | None = None):
        super().__init__()
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self._set_chunking(act_dim, horizon, execute, ensemble)
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, hidden=list(hidden), horizon=horizon,
                                execute=execute, steps=steps, activation=activation,
                                obs_normalization=obs_normalization, ensemble=ensemble)
        self.obs_dim, self.steps = obs_dim, steps
        self.normalizer = _normalizer(obs_dim, obs_normalization)
        self.net = mlp(obs_dim + horizon * act_dim + TIME_FEATURES, list(hidden), horizon * act_dim, activation)

    def velocity(self, o: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``v(o, x, t)`` with ``o`` the normalized observation ``[B, obs_dim]``, ``x [B, horizon * act_dim]``,
        ``t [B]``."""
        return self.net(torch.cat([o, x, time_embedding(t)], -1))

    def bc_loss(self, obs: torch.Tensor, target: torch.Tensor, generator: torch.Generator | None = None,
                **_) -> torch.Tensor:
        """The flow-matching loss on demonstrated chunks ``target [B, horizon, act_dim]``."""
        x1 = target.reshape(target.shape[0], -1)
        x0 = torch.randn(x1.shape, generator=generator, device=x1.device)
        t = torch.rand(x1.shape[0], generator=generator, device=x1.device)
        xt = (1.0 - t[:, None]) * x0 + t[:, None] * x1
        return ((self.velocity(self.normalizer(obs), xt, t) - (x1 - x0)) ** 2).mean()

    def integrate(self, obs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Euler steps of ``dx/dt = v`` from ``x`` at ``t = 0`` to ``t = 1``, clipped to the action box:
        ``[B, horizon, act_dim]``."""
        o, dt = self.normalizer(obs), 1.0 / self.steps
        for k in range(self.steps):
            x = x + dt * self.velocity(o, x, torch.full((x.shape[0],), k * dt, device=x.device))
        return x.clamp(-1.0, 1.0).reshape(-1, self.horizon, self.act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic chunk (from the prior's mode ``x_0 = 0``)."""
        return self.integrate(obs, torch.zeros(obs.shape[0], self.horizon * self.act_dim, device=obs.device))

    def chunk(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A chunk drawn from the flow (from ``x_0 ~ N(0, I)``)."""
        x0 = torch.randn(obs.shape[0], self.horizon * self.act_dim, generator=generator, device=obs.device)
        return self.integrate(obs, x0)


POLICIES.register("flow_chunk_mlp", FlowChunkActor)
