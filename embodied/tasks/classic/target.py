"""target: a purpose-built trivial task with a known optimum, for learning tests.

Each step shows a target ``t ~ U(-0.8, 0.8)^2``; the reward is ``1 - |a - t|^2``, so the optimal
policy is ``a = t`` with return exactly ``episode_steps``; a random policy scores far below.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms, box
from embodied.core.registry import TaskSpec, register_task


@dataclass
class TargetConfig:
    episode_steps: int = 10
    dim: int = 2
    target_range: float = 0.8


class TargetEnv(ManagedVecEnv):
    def __init__(self, cfg: TargetConfig, num_envs: int, device="cpu", seed: int = 0):
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.episode_steps)
        self.cfg = cfg
        self.target = torch.zeros(self.num_envs, cfg.dim, device=self.device)
        self.single_observation_space = gym.spaces.Dict({"policy": box(-1, 1, (cfg.dim,))})
        self.single_action_space = box(-1.0, 1.0, (cfg.dim,))

    def _draw(self, k: int) -> torch.Tensor:
        u = torch.rand(k, self.cfg.dim, generator=self.generator, device=self.device)
        return (u * 2 - 1) * self.cfg.target_range

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        self.target[env_ids] = self._draw(env_ids.numel())

    def _apply_action(self, action: torch.Tensor) -> None:
        self._error = action.clamp(-1, 1) - self.target
        self.target = self._draw(self.num_envs)

    def _observe(self) -> Obs:
        return {"policy": self.target.clone()}

    def _compute(self, action: torch.Tensor) -> StepTerms:
        terms = {"match": 1.0 - (self._error * self._error).sum(1)}
        return StepTerms(terms, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device))

    control_dt = 0.1  # [s] nominal: the task has no physical time (and no renderer)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "target": self.target.clone()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.target.copy_(state["target"])


register_task(
    TaskSpec(
        name="target",
        make=TargetEnv,
        config_cls=TargetConfig,
        description="Trivial: match a shown 2-D target (known optimum: return = episode_steps)",
        backends=("torch_vec",),
        default_algo="ppo",
    )
)
