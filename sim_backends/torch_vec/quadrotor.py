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

from embodied.core.base import resolve_device
from embodied.kernels import quadrotor as qk
from embodied.sim_backends.base import NamedLayout, SimBackend

# the column layouts of ``embodied.kernels.quadrotor`` (its module docstring), by name
STATE = NamedLayout(pos_w=3, quat_wb=4, lin_vel_w=3, ang_vel_b=3, rpm=4)
PARAMS = NamedLayout(mass=1, inertia=3, k_f=1, k_m=1, motor_tau=1, force_w=3, torque_b=3)
CONTROLS = NamedLayout(rpm_cmd=4)
assert STATE.dim == qk.STATE_DIM and PARAMS.dim == qk.PARAM_DIM


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
        """One row of the per-env parameter tensor (``PARAMS`` layout), no disturbance."""
        parts = {"mass": [self.mass], "inertia": list(self.inertia), "k_f": [self.k_f], "k_m": [self.k_m],
                 "motor_tau": [self.motor_tau], "force_w": [0.0] * 3, "torque_b": [0.0] * 3}
        return PARAMS.pack(**{k: torch.tensor(v, dtype=torch.float64) for k, v in parts.items()}).tolist()


class QuadrotorSim(SimBackend):
    """State ``x: [N, 17]`` (``STATE``) and parameters ``p: [N, 13]`` (``PARAMS``) as laid out in
    ``embodied.kernels.quadrotor``; the properties are ``[N, width]`` views (writes go through)."""

    STATE = STATE
    PARAMS = PARAMS
    CONTROLS = CONTROLS

    def __init__(self, num_envs: int, device: str | torch.device, params: QuadrotorParams | None = None,
                 kernel: str = "auto"):
        params = QuadrotorParams() if params is None else params
        self.num_envs = num_envs
        self.device = resolve_device(device)
        self.params = params
        self.kernel = kernel
        self.x = torch.zeros(num_envs, STATE.dim, device=self.device)
        STATE.view(self.x, "quat_wb")[:, 0] = 1.0  # identity rotation (w first)
        self.p = torch.tensor(params.as_row(), device=self.device).repeat(num_envs, 1)

    # named views [N, k] into the state, for tasks
    @property
    def pos_w(self) -> torch.Tensor:
        return STATE.view(self.x, "pos_w")

    @property
    def quat_wb(self) -> torch.Tensor:
        return STATE.view(self.x, "quat_wb")

    @property
    def lin_vel_w(self) -> torch.Tensor:
        return STATE.view(self.x, "lin_vel_w")

    @property
    def ang_vel_b(self) -> torch.Tensor:
        return STATE.view(self.x, "ang_vel_b")

    @property
    def rpm(self) -> torch.Tensor:
        return STATE.view(self.x, "rpm")

    # named views [N, k] into the per-env parameters (``params`` holds the nominal values)
    @property
    def mass(self) -> torch.Tensor:
        return PARAMS.view(self.p, "mass")

    @property
    def inertia(self) -> torch.Tensor:
        return PARAMS.view(self.p, "inertia")

    @property
    def k_f(self) -> torch.Tensor:
        return PARAMS.view(self.p, "k_f")

    @property
    def k_m(self) -> torch.Tensor:
        return PARAMS.view(self.p, "k_m")

    @property
    def motor_tau(self) -> torch.Tensor:
        return PARAMS.view(self.p, "motor_tau")

    @property
    def force_w(self) -> torch.Tensor:
        return PARAMS.view(self.p, "force_w")

    @property
    def torque_b(self) -> torch.Tensor:
        return PARAMS.view(self.p, "torque_b")

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
