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
