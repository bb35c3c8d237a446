"""A frozen base policy plus a learned residual (ResiP, Ankile et al. 2024): ``a = clip(b + clip(scale * r, -limit,
limit), -1, 1)`` with ``b = base.act(obs)`` and ``r = residual.act([obs, b])``, in normalized action units;
``scale`` and ``limit`` are one number or one per action dimension. The base is any actor ``build_policy`` rebuilds
(a BC run, chunked or not; an RL run); its parameters never train. ``reads="grounded"``: the residual reads
``[base.grounded(obs), b]`` instead of ``[obs, b]``: a language-conditioned base's view of the objects its instruction
names (``VLAPolicy.grounded``), so an MLP residual acts on "the target" and "the goal" without reading the
instruction."""

from __future__ import annotations

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, build_policy
from embodied.policies.chunked import reset_policy


def per_dimension(value: float | list[float] | tuple[float, ...]) -> float | list[float]:
    """A residual's scale or limit as plain data: a float for every action dimension, or a list of one per
    dimension."""
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return float(value)


class ResidualActor(nn.Module):
    spec_name = "residual"

    def __init__(self, base: dict, residual: dict, scale: float | list[float] = 0.1, limit: float | list[float] = 0.1,
                 reads: str = "obs"):
        super().__init__()
        self.init_kwargs = dict(base=base, residual=residual, scale=scale, limit=limit, reads=reads)
        self.base = build_policy(base).requires_grad_(False).eval()
        if reads not in ("obs", "grounded") or (reads == "grounded" and not hasattr(self.base, "grounded")):
            raise ValueError(f"reads is obs, or grounded for a base with a grounded view; got {reads!r}")
        self.reads = reads
        self.residual = build_policy(residual)
        # one value for every action dimension, or one per dimension (a sign-read gripper command needs a bound
        # past 1 to be flipped against its base, the arm's dimensions a small one)
        self.scale, self.limit = per_dimension(scale), per_dimension(limit)
        self.register_buffer("_scale", torch.tensor(self.scale, dtype=torch.float32), persistent=False)
        self.register_buffer("_limit", torch.tensor(self.limit, dtype=torch.float32), persistent=False)

    def train(self, mode: bool = True):  # the base stays in eval mode (frozen normalizer and all)
        super().train(mode)
        self.base.eval()
        return self

    @torch.no_grad()
    def base_action(self, obs: torch.Tensor, peek: bool = False) -> torch.Tensor:
        """The base's action; ``peek``: the one it would give, without advancing a chunked base's queues."""
        return self.base.peek(obs) if peek and hasattr(self.base, "peek") else self.base.act(obs)

    @torch.no_grad()
    def start_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The base's action from ``obs`` with nothing queued (a chunked base's first action of a fresh chunk): a
        function of ``obs`` alone, whatever the queues hold."""
        return self.base.chunk(obs)[:, 0] if hasattr(self.base, "chunk") else self.base.act(obs)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """New episodes in the envs of ``mask`` (all when None): a chunked base empties their queues."""
        reset_policy(self.base, mask)

    @torch.no_grad()
    def residual_input(self, obs: torch.Tensor, base_action: torch.Tensor) -> torch.Tensor:
        """What the residual reads: ``[obs, b]``, or ``[base.grounded(obs), b]``."""
        return torch.cat([self.base.grounded(obs) if self.reads == "grounded" else obs, base_action], -1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action with nothing queued (a chunked base's first action of a fresh chunk): what an
        exported graph computes at every control step (the ONNX export of a language-conditioned task traces it)."""
        b = self.start_action(obs)
        return self.combine(b, self.residual.act(self.residual_input(obs, b)))

    def combine(self, base_action: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        scale, limit = self._scale.to(residual.dtype), self._limit.to(residual.dtype)
        return (base_action + torch.clamp(scale * residual, -limit, limit)).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        b = self.base.act(obs)
        return self.combine(b, self.residual.act(self.residual_input(obs, b)))


POLICIES.register("residual", ResidualActor)
