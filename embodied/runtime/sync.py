"""The sync engine: the envs step in-process, between the learner's updates. Tensors cross between
the simulator device and the learner device in ``to_device`` only."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from embodied.algos.base import Obs, Transition, split_act
from embodied.runtime.base import Collector, EpisodeStats, MakeEnv, to_device


class SyncCollector(Collector):
    def __init__(self, make_env: MakeEnv, num_envs: int, seed: int, learner_device: torch.device | str,
                 runtime=None):
        self.env = make_env(num_envs, seed)
        self.num_envs = self.env.num_envs
        self.learner_device = torch.device(learner_device)
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self._obs: Obs | None = None  # on the sim device
        self.stats = EpisodeStats(self.num_envs, self.env.device)
        self.finished: list[dict[str, float]] = []  # completed episodes since the last pop
        self.log: dict[str, float] = {}

    @property
    def obs(self) -> Obs | None:
        return self._obs

    def reset(self, seed: int | None) -> None:
        self._obs, _ = self.env.reset(seed=seed)
        self.stats.reset()

    def reset_seeded(self, seeds: torch.Tensor, restore: tuple[torch.Tensor, torch.Tensor] | None = None,
                     tasks: torch.Tensor | None = None) -> None:
        if not hasattr(self.env, "reset_envs"):
            super().reset_seeded(seeds)
        self._obs = self.env.reset_envs(torch.as_tensor(seeds), tasks)
        if restore is not None:
            self._obs = self.env.restore_envs(*restore)
        self.stats.reset()

    def env_states(self) -> torch.Tensor | None:
        return self.env.env_states()

    def step(self, act: Callable[[Obs], torch.Tensor], version: int = 0) -> Transition:
        obs = to_device(self._obs, self.learner_device)
        action, extras = split_act(act(obs))
        next_obs, reward, terminated, truncated, info = self.env.step(to_device(action, self.env.device))
        self.log = info["log"]
        episodes = self.stats.track(reward, terminated | truncated, info.get("final_info"))
        if episodes is not None:
            self.finished.extend(episodes.as_dicts())
        tr = Transition(obs, action, to_device(reward, self.learner_device),
                        to_device(terminated, self.learner_device), to_device(truncated, self.learner_device),
                        next_obs=to_device(info["final_obs"], self.learner_device), extras=extras,
                        faulted=to_device(info["faulted"], self.learner_device) if "faulted" in info else None,
                        outcome=to_device(info["final_info"], self.learner_device) if "final_info" in info else None)
        self._obs = next_obs
        return tr

    def pop_episodes(self) -> list[dict[str, float]]:
        out, self.finished = self.finished, []
        return out

    def symmetry_group(self):
        return self.env.symmetry_group()

    def layout(self):
        return self.env.layout()

    def relabeller(self):
        return self.env.relabeller()

    def num_tasks(self) -> int:
        return getattr(self.env, "num_tasks", 0)

    def state_dict(self) -> dict:
        return {"obs": {k: v.clone() for k, v in self._obs.items()}, **self.stats.state_dict(),
                "finished": list(self.finished), "env": self.env.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        self.env.load_state_dict(state["env"])
        self._obs = {k: v.to(self.env.device) for k, v in state["obs"].items()}
        self.stats.load_state_dict(state)
        self.finished = list(state["finished"])

    def close(self) -> None:
        self.env.close()
