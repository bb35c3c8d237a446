"""pendulum-pixels: the pendulum swing-up seen through a 64x64 camera (issue 11: the pixel task the image world
models are trained and reported on). The MDP is ``pendulum``'s; the policy sees the last ``frame_stack`` RGB
frames (one frame has no angular velocity), the critic the true state. Frames are drawn with torch, batched:
a light background, a dark pivot and an anti-aliased red rod whose pixel coverage is
``sigmoid((rod_radius - distance to the rod segment) / edge)``."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from embodied.core.base import Obs
from embodied.core.errors import UserError
from embodied.core.layout import ActionTerm, Layout, Term
from embodied.core.registry import TaskSpec, register_task
from embodied.tasks.classic.pendulum import PendulumConfig, PendulumEnv

BACKGROUND = (0.92, 0.92, 0.88)
ROD = (0.80, 0.15, 0.12)
PIVOT = (0.1, 0.1, 0.1)
EXTENT = 1.25  # the image spans [-EXTENT, EXTENT] in units of the rod length, pivot at the centre


@dataclass
class PendulumPixelsConfig(PendulumConfig):
    image_size: int = 64  # [px] square frames
    frame_stack: int = 2  # frames per observation (oldest first, as channels)


def draw(theta: torch.Tensor, size: int) -> torch.Tensor:
    """RGB frames ``[N, 3, size, size]`` in [0, 1] of rods at ``theta [N]`` (0 = upright, counter-clockwise)."""
    c = (torch.arange(size, device=theta.device, dtype=torch.float32) + 0.5) / size * 2 * EXTENT - EXTENT
    px, py = c[None, :], -c[:, None]  # image rows go down, y goes up
    tip_x, tip_y = -torch.sin(theta)[:, None, None], torch.cos(theta)[:, None, None]
    t = (px * tip_x + py * tip_y).clamp(0.0, 1.0)  # projection on the unit-length rod
    dist = torch.sqrt((px - t * tip_x) ** 2 + (py - t * tip_y) ** 2)
    edge = EXTENT / size
    rod = torch.sigmoid((0.08 - dist) / edge)
    pivot = torch.sigmoid((0.1 - torch.sqrt(px ** 2 + py ** 2)) / edge).expand_as(rod)
    bg, fg, pv = (torch.tensor(v, device=theta.device)[None, :, None, None] for v in (BACKGROUND, ROD, PIVOT))
    img = bg * (1 - rod[:, None]) + fg * rod[:, None]
    return img * (1 - pivot[:, None]) + pv * pivot[:, None]


class PendulumPixelsEnv(PendulumEnv):
    def __init__(self, cfg: PendulumPixelsConfig, num_envs: int, device="cpu", seed: int = 0):
        if not 16 <= cfg.image_size <= 128 or not 1 <= cfg.frame_stack <= 4:
            raise UserError(f"image_size must be in 16-128 and frame_stack in 1-4, got {cfg.image_size}, "
                            f"{cfg.frame_stack}")
        super().__init__(cfg, num_envs, device, seed)
        s, k = cfg.image_size, cfg.frame_stack
        self.image_shape = (3 * k, s, s)
        state = self.single_observation_space["policy"]
        self.single_observation_space = gym.spaces.Dict({
            "policy": gym.spaces.Box(0.0, 1.0, (int(np.prod(self.image_shape)),), np.float32), "critic": state})
        self._frames = torch.zeros(self.num_envs, *self.image_shape, device=self.device)

    # frames change where the state does (a reset, a physics step), never in _observe, which the step template
    # calls twice in a step that resets some envs
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        super()._reset_idx(env_ids)
        img = draw(self.sim.theta[env_ids], self.cfg.image_size)
        self._frames[env_ids] = img.repeat(1, self.cfg.frame_stack, 1, 1)  # the first frame fills every slot

    def _apply_action(self, action: torch.Tensor) -> None:
        super()._apply_action(action)
        self._frames = torch.cat([self._frames[:, 3:], draw(self.sim.theta, self.cfg.image_size)], 1)

    def _observe(self) -> Obs:
        return {"policy": self._frames.reshape(self.num_envs, -1), "critic": super()._observe()["policy"]}

    def layout(self) -> Layout:
        frames = f"RGB in [0, 1], the last {self.cfg.frame_stack} frames"
        return Layout({"policy": (Term("camera", int(np.prod(self.image_shape)), "1", "camera", frames,
                                       shape=self.image_shape),),
                       "critic": (Term("state", 3, "1, 1, rad/s", "", "cos theta, sin theta, theta_dot"),)},
                      (ActionTerm("torque", 1, "N m", scale=self.cfg.max_torque),), 1.0 / self.control_dt)

    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        img = draw(self.sim.theta[env_idx:env_idx + 1], 256)[0]
        return (img.permute(1, 2, 0).cpu().numpy() * 255).astype(np.uint8)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "frames": self._frames.clone()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self._frames = state["frames"].clone().to(self.device)


register_task(TaskSpec(name="pendulum-pixels", make=PendulumPixelsEnv, config_cls=PendulumPixelsConfig,
                       description="Pendulum swing-up from 64x64 camera frames (the pixel task of the world models)",
                       backends=("torch_vec",), default_algo="ppo",
                       sweep_overrides={"episode_steps": 50}))  # the seeding rollouts cross a reset sooner
