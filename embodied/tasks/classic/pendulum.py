"""pendulum: classic torque-limited swing-up (gymnasium ``Pendulum-v1`` MDP), batched."""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms, box
from embodied.core.registry import TaskSpec, register_task
from embodied.sim_backends.base import choose_backend, make_backend
from embodied.sim_backends.torch_vec.pendulum import PendulumParams


@dataclass
class PendulumConfig:
    episode_steps: int = 200
    max_torque: float = 2.0  # [N m]
    angle_weight: float = 1.0  # cost on theta^2 [1/rad^2]
    speed_weight: float = 0.1  # cost on theta_dot^2
    torque_weight: float = 0.001  # cost on u^2
    backend: str | None = None  # sim backend, one of the task's TaskSpec.backends (None: the first)


def angle_normalize(th: torch.Tensor) -> torch.Tensor:
    """Wrap to [-pi, pi)."""
    return torch.remainder(th + math.pi, 2 * math.pi) - math.pi


class PendulumEnv(ManagedVecEnv):
    """Action in [-1, 1] scales to [-max_torque, max_torque]; obs (cos th, sin th, th_dot)."""

    def __init__(self, cfg: PendulumConfig, num_envs: int, device="cpu", seed: int = 0):
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.episode_steps)
        self.cfg = cfg
        self.sim = make_backend(choose_backend("pendulum", cfg.backend), "pendulum", self.num_envs, self.device,
                                params=PendulumParams(max_torque=cfg.max_torque))
        high = np.array([1.0, 1.0, self.sim.params.max_speed], dtype=np.float32)
        self.single_observation_space = gym.spaces.Dict({"policy": gym.spaces.Box(-high, high, dtype=np.float32)})
        self.single_action_space = box(-1.0, 1.0, (1,))

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        k, S = env_ids.numel(), self.sim.STATE
        u = torch.rand(k, S.dim, generator=self.generator, device=self.device) * 2 - 1  # U(-1, 1) per column
        scale = S.pack(theta=u.new_tensor([math.pi]), theta_dot=u.new_tensor([1.0]))  # [rad], [rad/s]
        self.sim.set_state_idx(env_ids, u * scale)

    def _apply_action(self, action: torch.Tensor) -> None:
        self.sim.step(action.clamp(-1, 1) * self.cfg.max_torque)

    def _observe(self) -> Obs:
        th, thdot = self.sim.theta, self.sim.theta_dot
        return {"policy": torch.stack([torch.cos(th), torch.sin(th), thdot], 1)}

    def _compute(self, action: torch.Tensor) -> StepTerms:
        # the cost uses the state before the physics step in gymnasium; we use the state after it,
        # which is the same MDP shifted by one step (and what a robot's sensors report)
        th, thdot = angle_normalize(self.sim.theta), self.sim.theta_dot
        u = action[:, 0].clamp(-1, 1) * self.cfg.max_torque
        c = self.cfg
        terms = {
            "angle": -c.angle_weight * th * th,
            "speed": -c.speed_weight * thdot * thdot,
            "torque": -c.torque_weight * u * u,
        }
        return StepTerms(terms, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device))

    def _state_finite(self) -> torch.Tensor:
        return self.sim.finite()

    control_dt = PendulumParams.dt  # [s] one control step is one physics step

    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        from embodied.render import pendulum_frame

        return pendulum_frame(float(self.sim.theta[env_idx]), float(self.episode_length[env_idx]) * self.control_dt)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sim": self.sim.get_state()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.sim.set_state(state["sim"])


register_task(
    TaskSpec(
        name="pendulum",
        make=PendulumEnv,
        config_cls=PendulumConfig,
        description="Torque-limited pendulum swing-up (Pendulum-v1 dynamics)",
        backends=("torch_vec",),
        default_algo="ppo",
    )
)
