"""Batched quadrotor rigid body with first-order motors, RK4 at 100 Hz (tensor simulator).

Parameter set: the Crazyflie 2.1 model released with "Learning to Fly in Seconds" (RLtools
learning-to-fly, ``crazy_flie.h``; ../shared/reference/quadrotor.md 1.2): mass 0.027 kg,
J = diag(3.85e-6, 3.85e-6, 5.9675e-6), f = 3.16e-10 rpm^2, k_m = 0.005964552, motor lag 0.15 s,
rpm in [0, 21702]. We use it rather than the newer l2f set because it is the set the published
hover task (RPM actions, reward, curriculum, 146-dim observation) was designed, trained and flown
with; the newer set adds deck masses and a throttle-curve thrust model tied to the l2f package.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embodied.kernels import quadrotor as qk
from embodied.sim_backends.base import SimBackend


@dataclass(frozen=True)
class QuadrotorParams:
    """Nominal physical parameters (Crazyflie 2.1, learning-to-fly release)."""

    mass: float = 0.027  # [kg]
    inertia: tuple[float, float, float] = (3.85e-6, 3.85e-6, 5.9675e-6)  # [kg m^2]
    k_f: float = 3.16e-10  # thrust per rpm^2 [N / rpm^2]
    k_m: float = 0.005964552  # yaw torque per thrust [m]
    motor_tau: float = 0.15  # motor time constant [s]
    rpm_max: float = 21702.0  # [1/min]
    dt: float = 0.01  # integration step [s] (100 Hz)

    @property
    def hover_rpm(self) -> float:
        return (self.mass * qk.GRAVITY / (4 * self.k_f)) ** 0.5

    def as_row(self) -> list[float]:
        return [self.mass, *self.inertia, self.k_f, self.k_m, self.motor_tau, 0, 0, 0, 0, 0, 0]


class QuadrotorSim(SimBackend):
    """State ``x: [N, 17]`` and parameters ``p: [N, 13]`` as laid out in ``embodied.kernels.quadrotor``."""

    def __init__(self, num_envs: int, device: torch.device, params: QuadrotorParams, kernel: str = "auto"):
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.params = params
        self.kernel = kernel
        self.x = torch.zeros(num_envs, qk.STATE_DIM, device=self.device)
        self.x[:, 3] = 1.0
        self.p = torch.tensor(params.as_row(), device=self.device).repeat(num_envs, 1)

    # named views [N, k] into the state, for tasks
    @property
    def pos_w(self) -> torch.Tensor:
        return self.x[:, 0:3]

    @property
    def quat_wb(self) -> torch.Tensor:
        return self.x[:, 3:7]

    @property
    def lin_vel_w(self) -> torch.Tensor:
        return self.x[:, 7:10]

    @property
    def ang_vel_b(self) -> torch.Tensor:
        return self.x[:, 10:13]

    @property
    def rpm(self) -> torch.Tensor:
        return self.x[:, 13:17]

    def step(self, controls: torch.Tensor) -> None:
        """``controls: [N, 4]`` commanded rpm; clipped to ``[0, rpm_max]``."""
        u = controls.clamp(0.0, self.params.rpm_max)
        qk.rk4_step_(self.x, self.p, u, self.params.dt, impl=self.kernel)

    def set_state_idx(self, env_ids: torch.Tensor, state: torch.Tensor) -> None:
        self.x[env_ids] = state

    def set_params_idx(self, env_ids: torch.Tensor, params: torch.Tensor) -> None:
        self.p[env_ids] = params

    def get_state(self) -> dict[str, torch.Tensor]:
        return {"x": self.x.clone(), "p": self.p.clone()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        self.x.copy_(state["x"])
        self.p.copy_(state["p"])

    def finite(self) -> torch.Tensor:
        return torch.isfinite(self.x).all(1)
