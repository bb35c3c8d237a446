"""Generalized Advantage Estimation (Schulman et al. 2016)."""

from __future__ import annotations

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_values: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns over a rollout.

    rewards, values, dones: ``[T, N]`` (``dones[t]`` = the episode ended at step t, terminated or
    truncated; truncation is bootstrapped into ``rewards`` by the caller); last_values: ``[N]`` = V(s_T).
        delta_t = r_t + gamma V_{t+1} (1 - d_t) - V_t
        A_t     = delta_t + gamma lam (1 - d_t) A_{t+1}
        R_t     = A_t + V_t
    """
    num_steps = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_values)
    next_value = last_values
    not_done = 1.0 - dones.to(rewards.dtype)
    for t in reversed(range(num_steps)):
        delta = rewards[t] + gamma * next_value * not_done[t] - values[t]
        next_adv = delta + gamma * lam * not_done[t] * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


def vtrace(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_values: torch.Tensor,
           log_rhos: torch.Tensor, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA, eqs. 1 and 4).

    ``[T, N]`` like ``gae``; ``log_rhos = log pi(a_t|x_t) - log mu(a_t|x_t)`` (target over behaviour).
        rho_t = min(rho_bar, e^log_rho_t),  c_t = min(c_bar, e^log_rho_t)
        delta_t = rho_t (r_t + gamma (1 - d_t) V_{t+1} - V_t)
        v_t - V_t = delta_t + gamma (1 - d_t) c_t (v_{t+1} - V_{t+1}),   v_T = V_T
        A_t = rho_t (r_t + gamma (1 - d_t) v_{t+1} - V_t)
    Returns ``(v, A)``. With ``log_rhos = 0`` and ``c_bar = 1``, ``v`` is the lambda=1 return.
    """
    rhos = log_rhos.exp()
    rho, c = rhos.clamp(max=rho_bar), rhos.clamp(max=c_bar)
    not_done = 1.0 - dones.to(rewards.dtype)
    next_values = torch.cat([values[1:], last_values[None]], 0)
    deltas = rho * (rewards + gamma * not_done * next_values - values)
    vs_minus_v = torch.zeros_like(rewards)
    acc = torch.zeros_like(last_values)
    for t in reversed(range(rewards.shape[0])):
        acc = deltas[t] + gamma * not_done[t] * c[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    next_vs = torch.cat([vs[1:], last_values[None]], 0)
    return vs, rho * (rewards + gamma * not_done * next_vs - values)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float | None:
    """``1 - Var[R - V] / Var[R]`` over a batch: 1 when the critic predicts the value targets exactly, 0 when it does
    no better than their mean, negative when worse (CleanRL's PPO diagnostic). None when the targets do not vary."""
    var = returns.var(unbiased=False)
    if float(var) == 0.0:
        return None
    return float(1.0 - (returns - values).var(unbiased=False) / var)
