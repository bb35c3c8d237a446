"""Collectors: the seam between simulation and learning (DESIGN.md, "Collector").

``SyncCollector`` runs the env in-process. Tensors cross between the simulator device and the
learner device in ``_to_learner`` / ``_to_sim`` only."""

from __future__ import annotations

from collections.abc import Callable

import torch

from embodied.algos.base import Obs, Transition
from embodied.core.base import VecEnv


class SyncCollector:
    def __init__(self, env: VecEnv, learner_device: torch.device):
        self.env = env
        self.learner_device = torch.device(learner_device)
        self.obs: Obs | None = None
        n = env.num_envs
        self.episode_return = torch.zeros(n, device=env.device)
        self.episode_length = torch.zeros(n, dtype=torch.long, device=env.device)
        self.finished: list[dict[str, float]] = []  # completed episodes since the last pop
        self.log: dict[str, float] = {}  # latest env log (task terms, metrics)

    def _to_learner(self, x):
        if isinstance(x, dict):
            return {k: v.to(self.learner_device, non_blocking=True) for k, v in x.items()}
        return x.to(self.learner_device, non_blocking=True)

    def _to_sim(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.env.device, non_blocking=True)

    def reset(self, seed: int | None) -> None:
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return.zero_()
        self.episode_length.zero_()

    def step(self, act: Callable[[Obs], torch.Tensor]) -> Transition:
        obs = self._to_learner(self.obs)
        action = act(obs)
        next_obs, reward, terminated, truncated, info = self.env.step(self._to_sim(action))
        self._track(reward, terminated | truncated, info)
        tr = Transition(obs, action, self._to_learner(reward), self._to_learner(terminated),
                        self._to_learner(truncated), next_obs=self._to_learner(info["final_obs"]))
        self.obs = next_obs
        return tr

    def _track(self, reward, done, info) -> None:
        self.episode_return += reward
        self.episode_length += 1
        self.log = info["log"]
        if done.any():
            ids = done.nonzero().squeeze(-1)
            rets = self.episode_return[ids].tolist()
            lens = self.episode_length[ids].tolist()
            extra = {k: v[ids].tolist() for k, v in info.get("final_info", {}).items()}
            for j in range(len(rets)):
                self.finished.append({"return": rets[j], "length": lens[j], **{k: v[j] for k, v in extra.items()}})
            self.episode_return[ids] = 0.0
            self.episode_length[ids] = 0

    def pop_episodes(self) -> list[dict[str, float]]:
        out, self.finished = self.finished, []
        return out

    def state_dict(self) -> dict:
        return {"obs": {k: v.clone() for k, v in self.obs.items()}, "episode_return": self.episode_return.clone(),
                "episode_length": self.episode_length.clone(), "finished": list(self.finished),
                "env": self.env.state_dict()}

    def load_state_dict(self, state) -> None:
        self.env.load_state_dict(state["env"])
        self.obs = {k: v.to(self.env.device) for k, v in state["obs"].items()}
        self.episode_return.copy_(state["episode_return"])
        self.episode_length.copy_(state["episode_length"])
        self.finished = list(state["finished"])
