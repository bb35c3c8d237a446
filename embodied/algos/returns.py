"""Returns for actor-critics that learn in imagination (DreamerV3, Hafner et al. 2023; reference subsystems.md 2.2):
lambda-returns over segments of imagined (or real) steps, and the percentile return scale the actor's advantages are
divided by."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def segment_lambda_returns(reward: torch.Tensor, terminated: torch.Tensor, done: torch.Tensor,
                           next_value: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Lambda-returns over segments ``[B, H]`` of consecutive env steps in which episodes may end and restart:

        R_t = r_t + gamma (1 - term_t) ((1 - l_t) v(s'_t) + l_t R_{t+1}),   l_t = lam, or 0 where the episode ends
              at t (``done``: terminated or truncated) and at the segment's last step,

    with ``next_value [B, H]`` the value of each step's own next observation (the final one where an episode
    ended): a truncated episode bootstraps from its final state, a terminated one not at all."""
    if not reward.shape == terminated.shape == done.shape == next_value.shape:
        raise ValueError(f"reward {tuple(reward.shape)}, terminated {tuple(terminated.shape)}, done "
                         f"{tuple(done.shape)} and next_value {tuple(next_value.shape)} must all be [B, H]")
    out = torch.empty_like(reward)
    ret = next_value[:, -1]
    for t in range(reward.shape[1] - 1, -1, -1):
        chain = 0.0 if t == reward.shape[1] - 1 else lam * (~done[:, t]).float()
        ret = reward[:, t] + gamma * (~terminated[:, t]).float() * ((1 - chain) * next_value[:, t] + chain * ret)
        out[:, t] = ret
    return out


def imagined_lambda_returns(reward: torch.Tensor, cont: torch.Tensor, value: torch.Tensor, gamma: float,
                            lam: float) -> torch.Tensor:
    """Lambda-returns of imagined rollouts ``[H, B]`` (DreamerV1-V3), differentiable in every input:

        R_H = v_H,   R_t = r_t + gamma c_t ((1 - lam) v_t+1 + lam R_t+1),

    with ``c_t`` the probability that the episode goes on after step ``t`` and ``value [H + 1, B]`` the values of the
    states ``s_0 .. s_H``. Returns ``R_0 .. R_H-1``."""
    if not reward.shape == cont.shape or value.shape != (reward.shape[0] + 1, *reward.shape[1:]):
        raise ValueError(f"reward {tuple(reward.shape)} and cont {tuple(cont.shape)} must be [H, B] and value "
                         f"{tuple(value.shape)} [H + 1, B]")
    ret, out = value[-1], []
    for t in range(reward.shape[0] - 1, -1, -1):
        ret = reward[t] + gamma * cont[t] * ((1 - lam) * value[t + 1] + lam * ret)
        out.append(ret)
    return torch.stack(out[::-1])


class PercentileScale:
    """DreamerV3's return normalization: EMAs (``rate``) of the 5th and 95th percentiles of the returns, and the
    scale ``max(limit, P95 - P5)`` that advantages are divided by (small returns are not blown up)."""

    def __init__(self, rate: float = 0.01, limit: float = 1.0, low: float = 0.05, high: float = 0.95, device=None):
        self.rate, self.limit, self.q = rate, limit, torch.tensor([low, high], device=device)
        self.low = torch.zeros((), device=device)
        self.high = torch.zeros((), device=device)

    def update(self, returns: torch.Tensor) -> torch.Tensor:
        """Feed a batch of returns; returns the new scale."""
        lo, hi = torch.quantile(returns.detach().flatten().float(), self.q.to(returns.device))
        self.low = self.low + self.rate * (lo - self.low)
        self.high = self.high + self.rate * (hi - self.high)
        return self.scale

    @property
    def scale(self) -> torch.Tensor:
        return torch.clamp(self.high - self.low, min=self.limit)

    def state_dict(self) -> dict:
        return {"low": self.low.clone(), "high": self.high.clone()}

    def load_state_dict(self, state: Mapping) -> None:
        self.low, self.high = state["low"].clone(), state["high"].clone()
