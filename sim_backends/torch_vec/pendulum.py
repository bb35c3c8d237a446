"""Batched classic pendulum (gymnasium ``Pendulum-v1`` dynamics), semi-implicit Euler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embodied.core.base import resolve_device
from embodied.sim_backends.base import NamedLayout, TensorStateBackend


@dataclass(frozen=True)
class PendulumParams:
    g: float = 10.0  # [m/s^2]
    mass: float = 1.0  # [kg]
    length: float = 1.0  # [m]
    dt: float = 0.05  # [s]
    max_speed: float = 8.0  # [rad/s]
    max_torque: float = 2.0  # [N m]


class PendulumSim(TensorStateBackend):
    """State ``x: [N, 2]`` = (theta [rad], theta_dot [rad/s]); theta = 0 is upright."""

    STATE = NamedLayout(theta=1, theta_dot=1)
    CONTROLS = NamedLayout(torque=1)  # [N m]

    def __init__(self, num_envs: int, device: str | torch.device, params: PendulumParams | None = None):
        self.num_envs = num_envs
        self.device = resolve_device(device)
        self.params = PendulumParams() if params is None else params
        self.x = torch.zeros(num_envs, self.STATE.dim, device=self.device)

    # named views [N] into the state, for tasks
    @property
    def theta(self) -> torch.Tensor:
        return self.STATE.column(self.x, "theta")

    @property
    def theta_dot(self) -> torch.Tensor:
        return self.STATE.column(self.x, "theta_dot")

    def step(self, controls: torch.Tensor) -> None:
        """``controls: [N, 1]`` torque [N m], clipped to ``max_torque``."""
        p = self.params
        u = self.CONTROLS.column(controls, "torque").clamp(-p.max_torque, p.max_torque)
        th, thdot = self.theta, self.theta_dot
        thdot = thdot + (3 * p.g / (2 * p.length) * torch.sin(th) + 3.0 / (p.mass * p.length**2) * u) * p.dt
        thdot = thdot.clamp(-p.max_speed, p.max_speed)
        self.x = self.STATE.pack(theta=(th + thdot * p.dt)[:, None], theta_dot=thdot[:, None])

    def finite(self) -> torch.Tensor:
        return torch.isfinite(self.x).all(1)
