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


def ensemble_weights(horizon: int, decay: float) -> torch.Tensor:
    """ACT's temporal-ensembling weights by a prediction's age j (steps since the chunk was predicted):
    ``exp(decay j)``, normalized over the valid predictions when used. ACT writes ``exp(-m i)`` with ``i = 0`` the
    oldest; over the same predictions that is ``exp(m j)`` up to a constant, which the normalization removes."""
    return torch.exp(decay * torch.arange(horizon, dtype=torch.float32))


class ChunkQueue:
    """Per-env queues of predicted chunks for an ``nn.Module`` with ``horizon``, ``execute``, ``act_dim`` and
    ``chunk(obs) -> [B, horizon, act_dim]`` (its deterministic chunk): ``act`` executes ``execute`` actions of a
    chunk before it runs the network again for that env.

    With ``ensemble`` set (a decay ``m``; ACT's temporal ensembling, Zhao et al. 2023) the network runs every step
    instead, and the action is the weighted mean of every kept chunk's prediction for the current step, the
    prediction made ``j`` steps ago weighted ``exp(m j)`` (``m > 0`` favours older predictions, as ACT's 0.01)."""

    ensemble: float | None = None
    _queue: torch.Tensor | None = None  # [N, horizon, act_dim] per env
    _next: torch.Tensor | None = None  # [N] index of the next queued action; >= execute: look again
    _past: torch.Tensor | None = None  # ensembling: [N, horizon (age), horizon, act_dim] the last chunks, newest first
    _valid: torch.Tensor | None = None  # ensembling: [N, horizon] which ages hold a chunk of this episode

    def _set_chunking(self, act_dim: int, horizon: int, execute: int, ensemble: float | None) -> None:
        if not 1 <= execute <= horizon:
            raise ValueError(f"execute must be in 1..horizon, got {execute} of {horizon}")
        self.act_dim, self.horizon, self.execute, self.ensemble = int(act_dim), int(horizon), int(execute), ensemble

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """Empty the queues of the envs in ``mask`` (all when None): their next action comes from a new chunk.
        Resetting all drops the queues, so the next batch may hold another number of envs (training rollouts
        after an evaluation of more episodes than training envs)."""
        if mask is None:
            self._queue = self._next = self._past = self._valid = None
            return
        if self._valid is not None:
            self._valid[mask.to(self._valid.device)] = False
        if self._queue is None:
            return
        self._next[mask.to(self._next.device)] = self.execute

    def _ensembled(self, obs: torch.Tensor, advance: bool) -> torch.Tensor:
        n, h = obs.shape[0], self.horizon
        if self._past is None or self._past.shape[0] != n or self._past.device != obs.device:
            self._past = torch.zeros(n, h, h, self.act_dim, device=obs.device)
            self._valid = torch.zeros(n, h, dtype=torch.bool, device=obs.device)
        past = torch.cat([self.chunk(obs)[:, None], self._past[:, :-1]], 1)
        valid = torch.cat([torch.ones_like(self._valid[:, :1]), self._valid[:, :-1]], 1)
        if advance:
            self._past, self._valid = past, valid
        age = torch.arange(h, device=obs.device)
        w = ensemble_weights(h, float(self.ensemble)).to(obs.device) * valid  # [N, age]
        return (w[..., None] * past[:, age, age]).sum(1) / w.sum(1, keepdim=True)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        if self.ensemble is not None:
            return self._ensembled(obs, advance=True)
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
        if self.ensemble is not None:
            return self._ensembled(obs, advance=False)
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
                 activation: str = "relu", obs_normalization: bool = False, ensemble: float | None = None):
        super().__init__()
        self._set_chunking(act_dim, horizon, execute, ensemble)
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, hidden=list(hidden), horizon=horizon,
                                execute=execute, activation=activation, obs_normalization=obs_normalization,
                                ensemble=ensemble)
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
