"""quadrotor-hover-rates: the hover task one level up, the action an autopilot takes over MAVLink or cflib:
collective thrust and body rates, with a rate controller inside the plant.

    action = [thrust, p, q, r] in [-1, 1]:  thrust = (a0 + 1) / 2 of the vehicle's maximum total thrust,
             body rates (x forward, y left, z up) = a[1:] * (max_rate_rp, max_rate_rp, max_rate_yaw) [rad/s]
    rate controller (the firmware's, at the control rate, with the nominal constants it was flashed with):
             tau = J_nom K (w_cmd - w) + w x J_nom w,  then the X-mixer's inverse gives rotor thrusts,
             clipped to [0, f_max], and rotor speeds sqrt(f / k_f_nom) go to the motors (with their lag).

Everything else (observations, reward, termination, initial states, randomization, success) is
``quadrotor-hover``'s, so its results compare; it runs on the torch path (the fused kernel is RPM-level).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from embodied.core.errors import UserError
from embodied.core.layout import ActionTerm, Layout
from embodied.core.registry import TaskSpec, register_task
from embodied.core.symmetry import SymmetryGroup, concat, mirror_axial, permutation
from embodied.kernels.quadrotor import GRAVITY, ROTOR_DIR, ROTOR_X, ROTOR_Y
from embodied.tasks.quadrotor.hover import (
    MIRRORS,
    QuadrotorHoverConfig,
    QuadrotorHoverEnv,
    RewardWeights,
    strict_eval_config,
)


@dataclass
class QuadrotorRatesConfig(QuadrotorHoverConfig):
    kernel: str = "torch"  # the fused numba step is RPM-level; this task runs the tensor path
    position_average_s: float = 0.0  # the hover task's position average: not measured on this task
    # the hover task's reward floor left out: on this task seed 0 ended at 0.08 success with it (0.78 without;
    # neither met the stop rule in 300k env steps; stop 48)
    reward: RewardWeights = field(default_factory=lambda: RewardWeights(floor=None))
    max_rate_rp: float = 6.0  # [rad/s] roll and pitch rate at |a| = 1
    max_rate_yaw: float = 3.0  # [rad/s]
    rate_gain_rp: float = 20.0  # [1/s] proportional rate gain (with the lag inversion: a ~0.05 s rate response)
    rate_gain_yaw: float = 10.0  # [1/s]
    # motor-lag inversion: the controller models each motor as a first-order lag with the nominal time
    # constant and commands the speed that reaches the desired one within one control step (clipped to the
    # motor's range); without it the rate loop is as slow as the 0.15 s motors (a 3 rad/s step takes ~0.4 s)
    motor_inversion: bool = True


def mixer_inverse(k_m: float) -> torch.Tensor:
    """``[4, 4]``: rotor thrusts from (total thrust, tau_x, tau_y, tau_z) for the X configuration."""
    rx, ry, rd = torch.tensor(ROTOR_X), torch.tensor(ROTOR_Y), torch.tensor(ROTOR_DIR)
    a = torch.stack([torch.ones(4), ry, -rx, k_m * rd])
    return torch.linalg.inv(a.double()).float()


class QuadrotorRatesEnv(QuadrotorHoverEnv):
    def __init__(self, cfg: QuadrotorRatesConfig, num_envs: int, device="cpu", seed: int = 0):
        if cfg.kernel not in ("torch", "auto"):
            raise UserError(f"quadrotor-hover-rates runs on the torch path; env.kernel={cfg.kernel!r} is RPM-level")
        cfg = dataclasses.replace(cfg, kernel="torch")
        super().__init__(cfg, num_envs, device, seed)
        P = self.sim.PARAMS
        self.j_nom = P.view(self.nominal_p, "inertia")[0].clone()
        self.kf_nom, km = float(P.view(self.nominal_p, "k_f")[0, 0]), float(P.view(self.nominal_p, "k_m")[0, 0])
        self.mix = mixer_inverse(km).to(self.device)
        self.f_max = self.kf_nom * self.params.rpm_max ** 2  # one rotor [N]
        self.t_max = 4.0 * self.f_max
        self.max_rates = torch.tensor([cfg.max_rate_rp, cfg.max_rate_rp, cfg.max_rate_yaw], device=self.device)
        self.gains = torch.tensor([cfg.rate_gain_rp, cfg.rate_gain_rp, cfg.rate_gain_yaw], device=self.device)
        hover_thrust = float(P.view(self.nominal_p, "mass")[0, 0]) * GRAVITY / self.t_max
        tau_m = float(P.view(self.nominal_p, "motor_tau")[0, 0])
        self.lag_gain = 1.0 - math.exp(-self.params.dt / tau_m)  # fraction of a speed step one control step reaches
        self.motor_estimate = torch.full((self.num_envs, 4), 0.5 * self.params.rpm_max, device=self.device)
        self.hover_action = torch.tensor([2.0 * hover_thrust - 1.0, 0.0, 0.0, 0.0], device=self.device)

    def rotor_speeds(self, action: torch.Tensor) -> torch.Tensor:
        """The rate controller and mixer: ``[N, 4]`` normalized action -> commanded rpm ``[N, 4]``."""
        a = action.clamp(-1.0, 1.0)
        thrust = (a[:, :1] + 1.0) * (0.5 * self.t_max)
        w = self.sim.ang_vel_b
        jw = self.j_nom * w
        tau = self.j_nom * self.gains * (a[:, 1:] * self.max_rates - w) + torch.linalg.cross(w, jw)
        f = (torch.cat([thrust, tau], 1) @ self.mix.T).clamp(0.0, self.f_max)
        want = torch.sqrt(f / self.kf_nom)
        if not self.cfg.motor_inversion:
            return want
        est = self.motor_estimate  # the controller's model of the rotor speeds (nominal lag)
        cmd = (est + (want - est) / self.lag_gain).clamp(0.0, self.params.rpm_max)
        self.motor_estimate = est + (cmd - est) * self.lag_gain
        return cmd

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        super()._reset_idx(env_ids)
        if hasattr(self, "motor_estimate"):  # the motors start where the task starts them (mid range)
            self.motor_estimate[env_ids] = self.sim.rpm[env_ids]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "motor_estimate": self.motor_estimate.clone()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        if "motor_estimate" in state:
            self.motor_estimate.copy_(state["motor_estimate"])

    def _apply_action(self, action: torch.Tensor) -> None:
        a = action.clamp(-1.0, 1.0)
        self.actions.copy_(torch.cat([self.actions[:, 4:], a], 1))
        self.sim.step(self.rotor_speeds(a))
        self.total_env_steps += self.num_envs
        self._advance_curriculum()

    def symmetry_group(self) -> SymmetryGroup:
        """As the hover task's, with the action (thrust, body rates): thrust invariant, rates axial."""
        base = super().symmetry_group()
        h = self.cfg.action_history
        elements = []
        for (m, _), e in zip(MIRRORS, base.elements):
            act = concat(permutation([0]), mirror_axial(m, 1))
            hist = concat(*[concat(permutation([0], 18 + 4 * k), mirror_axial(m, 18 + 4 * k + 1)) for k in range(h)])
            pol, end = e["policy"], 18 + 4 * h  # the position average after the history mirrors as in hover
            elements.append({"policy": (pol[0][:18] + hist[0] + pol[0][end:], pol[1][:18] + hist[1] + pol[1][end:]),
                             "critic": e["critic"],
                             "action": act})
        return SymmetryGroup(elements, self.device)

    def layout(self) -> Layout:
        base = super().layout()
        (hist,) = [t for t in base.terms("policy") if t.source == "history"]
        cfg = self.cfg
        action = (ActionTerm("collective_thrust", 1, "1", scale=0.5, offset=0.5,
                             description=f"fraction of the maximum total thrust ({self.t_max:.4f} N)"),
                  ActionTerm("roll_pitch_rates", 2, "rad/s", scale=cfg.max_rate_rp,
                             description="x and y body rates (x forward, y left, z up)"),
                  ActionTerm("yaw_rate", 1, "rad/s", scale=cfg.max_rate_yaw, description="z body rate"))
        hold = [float(v) for v in self.hover_action]
        extras = dict(base.extras, hold_action=hold, land_action=[2 * (0.8 * (hold[0] + 1) / 2) - 1, 0.0, 0.0, 0.0],
                      max_rates=[cfg.max_rate_rp, cfg.max_rate_rp, cfg.max_rate_yaw], max_thrust_n=self.t_max,
                      hover_action=hold)
        described = hist.description.replace("actions as commanded", "(thrust, rate) actions")
        policy = tuple(dataclasses.replace(t, description=described) if t is hist else t for t in base.terms("policy"))
        return Layout({"policy": policy, "critic": base.terms("critic")}, action, base.control_hz, base.notes, extras)


register_task(TaskSpec(
    name="quadrotor-hover-rates",
    make=QuadrotorRatesEnv,
    config_cls=QuadrotorRatesConfig,
    description="quadrotor-hover with collective thrust + body rates (a rate controller in the plant): "
                "what MAVLink and cflib set-points carry",
    backends=("torch_vec",),
    success_metric="success",
    default_algo="td3",
    eval_config=strict_eval_config,
))
