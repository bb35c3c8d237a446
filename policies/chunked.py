"""An action-chunked policy (ACT, Zhao et al. 2023; Diffusion Policy's prediction/action horizons): from one
observation it predicts the next ``horizon`` actions, and ``act`` executes the first ``execute`` of them open loop
before it looks again. Each env of a batch keeps its own queue: ``reset(mask)`` empties the queues of the envs
that start a new episode (evaluation, the residual learner's rollouts and the deploy runner call it).

Chunks let a cloned policy commit to what the demonstrations did next (close the fingers, then lift) where a
per-step policy averages the two and stalls in between."""

from __future__ import annotations

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, _normalizer
from embodied.policies.networks import mlp


class ChunkQueue:
    """Per-env queues of predicted chunks for an ``nn.Module`` with ``horizon``, ``execute``, ``act_dim`` and
    ``chunk(obs) -> [B, horizon, act_dim]`` (its deterministic chunk): ``act`` executes ``execute`` actions of a
    chunk before it runs the network again for that env."""

    _queue: torch.Tensor | None = None  # [N, horizon, act_dim] per env
    _next: torch.Tensor | None = None  # [N] index of the next queued action; >= execute: look again

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """Empty the queues of the envs in ``mask`` (all when None): their next action comes from a new chunk."""
        if self._queue is None:
            return
        if mask is None:
            self._next.fill_(self.execute)
        else:
            self._next[mask.to(self._next.device)] = self.execute

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        n = obs.shape[0]
        if self._queue is None or self._queue.shape[0] != n or self._queue.device != obs.device:
            self._queue = torch.zeros(n, self.horizon, self.act_dim, device=obs.device)
            self._next = torch.full((n,), self.execute, dtype=torch.long, device=obs.device)
        stale = self._next >= self.execute
        if bool(stale.any()):
            self._queue[stale] = self.chunk(obs[stale])
            self._next[stale] = 0
        a = self._queue[torch.arange(n, device=obs.device), self._next]
        self._next += 1
        return a

    @torch.no_grad()
    def peek(self, obs: torch.Tensor) -> torch.Tensor:
        """The action ``act(obs)`` would give, without advancing the queues."""
        n = obs.shape[0]
        if self._queue is None or self._queue.shape[0] != n:
            return self.chunk(obs)[:, 0]
        stale = self._next >= self.execute
        out = self._queue[torch.arange(n, device=obs.device), self._next.clamp(max=self.horizon - 1)]
        if bool(stale.any()):  # only the envs that would look again run the network
            out[stale] = self.chunk(obs[stale])[:, 0]
        return out


class ChunkedActor(ChunkQueue, nn.Module):
    spec_name = "chunked_mlp"

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], horizon: int = 8, execute: int = 4,
                 activation: str = "relu", obs_normalization: bool = False):
        super().__init__()
        if not 1 <= execute <= horizon:
            raise ValueError(f"execute must be in 1..horizon, got {execute} of {horizon}")
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, hidden=list(hidden), horizon=horizon,
                                execute=execute, activation=activation, obs_normalization=obs_normalization)
        self.act_dim, self.horizon, self.execute = act_dim, horizon, execute
        self.normalizer = _normalizer(obs_dim, obs_normalization)
        self.net = mlp(obs_dim, list(hidden), horizon * act_dim, activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The chunk ``[B, horizon, act_dim]`` in [-1, 1] (training)."""
        return torch.tanh(self.net(self.normalizer(obs))).reshape(-1, self.horizon, self.act_dim)

    def chunk(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


def reset_policy(policy: nn.Module, mask: torch.Tensor | None = None) -> None:
    """Start new episodes for the envs in ``mask`` (all when None) of a policy that keeps per-env state (a chunk
    queue); a stateless policy has nothing to reset."""
    reset = getattr(policy, "reset", None)
    if callable(reset):
        reset(mask)


POLICIES.register("chunked_mlp", ChunkedActor)
