"""Sim backend contract (DESIGN.md): physics only. Batched state, ``step(controls)``, reset of a
subset of envs by index, state get/set for checkpoints. No rewards here."""

from __future__ import annotations

import abc

import torch


class SimBackend(abc.ABC):
    num_envs: int
    device: torch.device

    @abc.abstractmethod
    def step(self, controls: torch.Tensor) -> None:
        """Advance physics one control step. ``controls: [N, num_controls]`` in physical units."""

    @abc.abstractmethod
    def set_state_idx(self, env_ids: torch.Tensor, state: torch.Tensor) -> None:
        """Overwrite the physical state of ``env_ids`` (a subset reset)."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, torch.Tensor]:
        """Copies of everything that defines the simulation (state and per-env parameters)."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what ``get_state`` returned."""

    def finite(self) -> torch.Tensor:
        """``[N]`` bool: state of each env is finite (numerical faults are caught upstream)."""
        return torch.isfinite(self.get_state()["x"]).all(1)
