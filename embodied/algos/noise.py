"""Exploration noise correlated in time: an AR(1) process of standard normals (filtered-bc's rollouts, TD3's
exploration; OU noise in DDPG, pink noise)."""

from __future__ import annotations

import math

import torch

from embodied.core.errors import UserError


def check_correlation(key: str, rho: float) -> None:
    """``key``'s step-to-step correlation must lie in [0, 1) (1 would never draw fresh noise); else a UserError."""
    if not 0 <= rho < 1:
        raise UserError(f"{key} is the exploration noise's step-to-step correlation: in [0, 1), got {rho}")


def ar1_step(previous: torch.Tensor | None, fresh: torch.Tensor, rho: float,
             restart: torch.Tensor | None = None) -> torch.Tensor:
    """n_t = rho n_{t-1} + sqrt(1 - rho^2) e_t, e_t = ``fresh`` standard normals, so n_t stays standard normal with
    lag-1 correlation rho; ``fresh`` itself where the process starts (``previous`` None, or where ``restart``)."""
    if previous is None:
        return fresh
    step = rho * previous + math.sqrt(1.0 - rho * rho) * fresh
    return step if restart is None else torch.where(restart, fresh, step)
