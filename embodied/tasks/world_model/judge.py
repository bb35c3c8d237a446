"""Policies scored in a world model instead of on the real task (``log.keep_best_by=model``, issue 11).

``ModelJudge.score`` is a policy's mean return over imagined episodes of the real task's length: the elites' mean
(no sampling), no truncation by disagreement, from recorded real episode starts drawn with one fixed seed, so every
policy scored on the same model sees the same starts and they compare on equal terms. The model is the one a run
learns (``Imagination`` hands its network and its newest recorded starts) or a fitted one (``env.model``: the model
and the starts saved with it)."""

from __future__ import annotations

from dataclasses import replace

import torch

from embodied.sim_backends.world_model import load_world_model
from embodied.tasks.world_model.env import WorldModelEnv


class ModelJudge:
    """``world``: ``(network, meta)`` of a model in memory (a run that learns it), else ``env_cfg.model`` is loaded
    once (a fitted model: its saved episode starts, or every saved state where it recorded none)."""

    def __init__(self, env_cfg, task: str, device, seed: int, episode_steps: int, world=None):
        self.cfg = replace(env_cfg, horizon=episode_steps, deterministic=True, max_disagreement=None, start="initial")
        self.task, self.device, self.seed = task, torch.device(device), seed
        self.world = world if world is not None else load_world_model(env_cfg.model, self.device)
        meta = self.world[1]
        self.saved = None  # the fitted model's starts (an RSSM starts from its saved latents itself)
        if meta.get("kind", "ensemble") == "ensemble" and "starts" in meta:
            initial = meta.get("initial", meta["starts"])
            self.saved = (meta["starts"], initial if initial.shape[0] else meta["starts"])
        self._env: WorldModelEnv | None = None  # built on first use, for one number of episodes

    def score(self, act, episodes: int, learner_device, starts: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> float:
        """The mean imagined return of ``act`` over ``episodes`` episodes; ``starts``: ``(every recorded state, the
        recorded episode starts)`` to draw from (default: those the model was saved with)."""
        from embodied.evaluate import evaluate

        if self._env is None or self._env.num_envs != episodes:
            self._env = WorldModelEnv(self.cfg, episodes, self.device, seed=self.seed, task=self.task, world=self.world)
        if starts is not None or self.saved is not None:
            self._env.set_starts(*(starts if starts is not None else self.saved))
        return evaluate(act, self._env, seed=self.seed, learner_device=learner_device)["eval/return"]
