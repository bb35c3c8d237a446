"""``wm:<task>``: a learned model of ``<task>`` as a task like any other (issue 11).

The env's observation groups, action space and layout are the real task's; its state is the real observation
(groups concatenated), stepped by the model in batch. Episodes start from recorded real states, end where the
model's termination head says so, and are truncated at ``horizon`` steps or where the ensemble's members disagree
by more than ``max_disagreement`` (standardized units; compounding error grows with depth, so imagined episodes
are short). ``info["uncertainty"]`` carries the disagreement per env; the reward is the model's (term ``model``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms
from embodied.core.errors import UserError
from embodied.core.registry import TASKS
from embodied.sim_backends.base import make_backend
from embodied.sim_backends.world_model import EnsembleConfig, load_world_model


@dataclass
class WorldModelConfig:
    """What every ``wm:<task>`` config has; the family adds ``base``, the real task's own config."""

    model: str = ""  # world_model.pt, or a run directory holding one; empty: train learns one (algo sac/td3)
    horizon: int = 32  # [steps] imagined episode length before truncation
    max_disagreement: float | None = 4.0  # truncate where the elites' spread passes this (None: never)
    # MOPO's pessimism: the reward is the model's minus this times the elites' disagreement (reward term
    # ``uncertainty``), so a learner is paid less where the model is unsure and exploits its errors less (0: off)
    uncertainty_penalty: float = 0.0
    # ensemble: a predicted state is held within the recorded real states' range widened by this fraction of it on
    # each side (None: not held): a learner never bootstraps from a state far from every real one, where its critic
    # extrapolates freely (TD3 on quadrotor-hover in a young model: Q to 1e6 in 28k real steps without it). Only
    # held, not truncated: a sampled prediction of an entry the data saw in a narrow range often leaves it a little
    data_margin: float | None = 0.1
    start: str = "any"  # any: any recorded real state | initial: recorded episode starts only
    deterministic: bool = False  # the elite's mean instead of a sample
    terminal_threshold: float = 0.5  # the episode ends where the predicted termination probability passes this
    # --- training, when ``model`` is empty: real data trains the model, the learner trains in it ---------------
    mode: str = "dyna"  # dyna: the learner also learns from the real steps | dream: only from imagined ones
    model_envs: int = 256  # imagined rollouts stepped beside the real envs
    model_steps: int = 1  # steps of the model envs per real step of the batch
    warmup: int = 1000  # [real steps] before the first fit
    refit_every: int = 1000  # [real steps] between fits (each a fixed epoch budget, ensemble.epochs)
    data: str = ""  # real transitions to start from: a Minari dataset, or an off-policy run (its replay buffer)
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)


def check_config(cfg: WorldModelConfig) -> None:
    choices = {"start": ("any", "initial"), "mode": ("dyna", "dream")}
    for key, ok in choices.items():
        if getattr(cfg, key) not in ok:
            raise UserError(f"{key} must be one of {', '.join(ok)}, got {getattr(cfg, key)!r}")
    for key in ("horizon", "model_envs", "model_steps", "refit_every"):
        if getattr(cfg, key) < 1:
            raise UserError(f"{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.warmup < 0 or not 0 < cfg.terminal_threshold < 1:
        raise UserError("warmup must be >= 0 and terminal_threshold in (0, 1)")
    if cfg.data_margin is not None and not cfg.data_margin >= 0:
        raise UserError(f"data_margin must be >= 0 or null, got {cfg.data_margin}")
    if not cfg.uncertainty_penalty >= 0:
        raise UserError(f"uncertainty_penalty must be >= 0, got {cfg.uncertainty_penalty}")
    if cfg.max_disagreement is not None and not cfg.max_disagreement > 0:
        raise UserError(f"max_disagreement must be > 0 or null, got {cfg.max_disagreement}")
    e = cfg.ensemble
    if e.members < 1 or not 1 <= e.elites <= e.members or e.epochs < 1 or e.batch_size < 1 or not e.hidden:
        raise UserError("ensemble: members >= 1, elites in 1..members, epochs >= 1, batch_size >= 1, hidden not empty")
    if not 0 <= e.holdout < 1 or e.max_updates < 1:
        raise UserError(f"ensemble.holdout must be in [0, 1) and max_updates >= 1, got {e.holdout}, {e.max_updates}")


class WorldModelEnv(ManagedVecEnv):
    """``wm:<task>``. ``world``: ``(network, meta)`` of a model in memory (training builds it so); otherwise the
    model is loaded from ``cfg.model``: an ensemble (state tasks) or an RSSM (image tasks; episodes start from latent
    states the RSSM reached over real context frames)."""

    def __init__(self, cfg, num_envs: int, device="cpu", seed: int = 0, task: str = "", world=None):
        check_config(cfg)
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.horizon)
        self.cfg, self.task = cfg, task
        network, meta = world if world is not None else load_world_model(cfg.model, self.device)
        if meta.get("task", task) != task:
            raise UserError(f"the world model at {cfg.model} was fitted on task {meta['task']!r}, not {task!r}")
        real = self.spaces_of(task, cfg.base)
        self.single_observation_space, self.single_action_space = real["observation"], real["action"]
        self._layout, self._symmetry, self.control_dt = real["layout"], real["symmetry"], real["control_dt"]
        self.groups = [(k, s.shape[0]) for k, s in self.single_observation_space.spaces.items()]
        obs_dim, act_dim = sum(d for _, d in self.groups), self.single_action_space.shape[0]
        self.kind = meta.get("kind", "ensemble")
        if self.kind == "rssm":
            self._check_rssm(network, meta, act_dim)
        elif (network.state_dim, network.act_dim) != (obs_dim, act_dim):
            raise UserError(f"the world model predicts {network.state_dim} state / {network.act_dim} action "
                            f"dims; {task} has {obs_dim} / {act_dim}")
        self.sim = make_backend("world_model", self.kind, self.num_envs, self.device, network=network,
                                generator=self.generator, deterministic=cfg.deterministic)
        lows = np.concatenate([s.low for s in self.single_observation_space.spaces.values()])
        highs = np.concatenate([s.high for s in self.single_observation_space.spaces.values()])
        self._low = torch.as_tensor(lows, device=self.device)
        self._high = torch.as_tensor(highs, device=self.device)
        space = self.single_action_space
        self._act_low = torch.as_tensor(space.low, device=self.device)
        self._act_high = torch.as_tensor(space.high, device=self.device)
        # the task's observation, flat (for the ensemble it is also the model's state, sim.x)
        self._obs = torch.zeros(self.num_envs, obs_dim, device=self.device)
        # the task's action-history terms: kept exactly (shifted, the new action appended), not predicted, and left
        # out of the disagreement, as the deploy runner keeps them on a robot (core/layout.py); its average terms
        # likewise, from the predicted (and held) entries they average: (average, averaged, decay)
        self._history: list[slice] = []
        self._averages: list[tuple[slice, slice, float]] = []
        start = 0
        for group, size in self.groups:
            if group in self._layout.observation:
                slices = self._layout.slices(group)
                for term, sl in zip(self._layout.terms(group), slices.values()):
                    if term.source == "history":
                        self._history.append(slice(start + sl.start, start + sl.stop))
                    elif term.source == "average":
                        src = slices[term.average_of]
                        self._averages.append((slice(start + sl.start, start + sl.stop),
                                               slice(start + src.start, start + src.stop), term.average_decay))
            start += size
        self._averages.sort(key=lambda a: a[0].start)
        self._exact = self._history + [avg for avg, _, _ in self._averages]  # the entries the env keeps itself
        if self._exact and self.kind != "rssm":
            free = torch.ones(obs_dim, dtype=torch.bool)
            for sl in self._exact:
                free[sl] = False
            self.sim.disagreement_dims = free.nonzero().squeeze(1).to(self.device)
        self._data_low = self._data_high = None  # the widened range of the real states (data_margin)
        self._held = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)  # held in it this step
        if self.kind == "rssm":  # latent states after a real context, and the real observation there
            self.starts = meta["starts"].to(self.device, torch.float32)
            self.start_obs = meta["start_obs"].to(self.device, torch.float32)
        else:
            self.set_starts(meta.get("starts", torch.zeros(0, obs_dim)), meta.get("initial", torch.zeros(0, obs_dim)))

    def _check_rssm(self, network, meta: dict, act_dim: int) -> None:
        """The RSSM sees the newest frame (``frame_channels`` channels) of the image group and the other groups
        as one vector; the env re-stacks frames as the task does."""
        spaces = self.single_observation_space.spaces
        self.image_group, self.frame_channels = meta["image_group"], int(meta["frame_channels"])
        images = self._layout.images(self.image_group) if self.image_group in spaces else []
        if len(images) != 1 or images[0][0] != slice(0, spaces[self.image_group].shape[0]):
            raise UserError(f"the RSSM models group {self.image_group!r} as one image; {self.task} has {images}")
        c, h, w = self.image_shape = tuple(images[0][1])
        vector = sum(d for k, d in self.groups if k != self.image_group)
        if network.image != (self.frame_channels, h, w) or network.vector != vector or network.act_dim != act_dim:
            raise UserError(f"the RSSM models {network.image} images, {network.vector} other entries and "
                            f"{network.act_dim} actions; {self.task} has frames of ({self.frame_channels}, {h}, "
                            f"{w}), {vector} other entries and {act_dim} actions")

    @staticmethod
    def spaces_of(task: str, cfg) -> dict:
        """Spaces, layout, symmetry and control period of the real ``task`` (one env of it, built and closed)."""
        real = TASKS.get(task).make(cfg, num_envs=1, device="cpu", seed=0)
        out = {"observation": real.single_observation_space, "action": real.single_action_space,
               "layout": real.layout(), "symmetry": real.symmetry_group(), "control_dt": real.control_dt,
               "max_episode_steps": real.max_episode_steps}
        real.close()
        return out

    def set_starts(self, starts: torch.Tensor, initial: torch.Tensor) -> None:
        """The real states episodes start from (``[M, S]``; ``initial``: recorded episode starts)."""
        chosen = initial if self.cfg.start == "initial" else starts
        if chosen.shape[0] == 0:  # nothing recorded yet: the origin (only before a model was fitted)
            chosen = torch.zeros(1, self.sim.STATE.dim)
        self.starts = chosen.to(self.device, torch.float32)
        self._data_low = self._data_high = None
        if self.cfg.data_margin is not None and self.kind != "rssm" and starts.shape[0] > 1:
            lo, hi = starts.amin(0).to(self.device, torch.float32), starts.amax(0).to(self.device, torch.float32)
            pad = self.cfg.data_margin * (hi - lo)
            self._data_low, self._data_high = lo - pad, hi + pad
            for sl in self._exact:  # kept exactly: never held
                self._data_low[sl], self._data_high[sl] = -math.inf, math.inf

    # ---- task hooks ---------------------------------------------------------------------------------------
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        pick = torch.randint(self.starts.shape[0], (env_ids.numel(),), generator=self.generator, device=self.device)
        self.sim.set_state_idx(env_ids, self.starts[pick])
        self._obs[env_ids] = self.start_obs[pick] if self.kind == "rssm" else self.starts[pick]

    def _apply_action(self, action: torch.Tensor) -> None:
        action = torch.minimum(torch.maximum(action, self._act_low), self._act_high)
        before = self._obs
        self.sim.step(action)
        if self.kind == "rssm":
            self._obs = torch.minimum(torch.maximum(self._rssm_observation(), self._low), self._high)
            return
        self._obs, held = self._keep(before, self.sim.x, action)
        if held is not None:
            self._held = held
        self.sim.x = self._obs

    def _keep(self, before: torch.Tensor, predicted: torch.Tensor,
              action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a step does to an ensemble's prediction of the flat observation after ``before`` (differentiable):
        the action-history terms kept exactly (shifted, ``action`` appended), the observation held within the bounds
        the real one has (unit vectors, speed limits) and near the real states (``data_margin``), the average terms
        advanced from what they average there. Returns the observation and the rows the data range held (None
        without one)."""
        obs = predicted
        if self._history:
            a, parts, at = action.shape[1], [], 0
            for sl in self._history:  # oldest first: drop the oldest action, append this one
                parts += [obs[:, at:sl.start], before[:, sl][:, a:], action]
                at = sl.stop
            obs = torch.cat([*parts, obs[:, at:]], 1)
        obs = torch.minimum(torch.maximum(obs, self._low), self._high)
        if self._data_low is None:
            return self._advance_averages(before, obs), None
        kept = torch.minimum(torch.maximum(obs, self._data_low), self._data_high)
        return self._advance_averages(before, kept), (kept != obs).any(1)

    def _advance_averages(self, before: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` with each average term ``decay * (its value in before) + (1 - decay) * (the averaged entries in
        obs)``, as the task and the deploy runner advance it (differentiable)."""
        if not self._averages:
            return obs
        parts, at = [], 0
        for avg, src, d in self._averages:
            parts += [obs[:, at:avg.start], before[:, avg] * d + obs[:, src] * (1.0 - d)]
            at = avg.stop
        return torch.cat([*parts, obs[:, at:]], 1)

    def imagine_step(self, obs: Obs, action: torch.Tensor, generator: torch.Generator,
                     sample: bool = True) -> tuple[Obs, torch.Tensor, torch.Tensor]:
        """A step of the model from any batch of observations ``obs`` (the task's groups), differentiable in ``obs``
        and ``action``, for learners that backpropagate through the dynamics: one random elite for the whole batch
        (``generator``), a reparameterized sample of it (its mean with ``sample=False`` or ``deterministic``), and
        what a step of this env does to the prediction (``_keep``). Returns the next observation, the reward ``[B]``
        and the termination probability ``[B]``; the env's own state is untouched."""
        if self.kind == "rssm":
            raise UserError("dynamics gradients need an ensemble world model (state tasks); the RSSM is stepped only")
        net = self.sim.network
        x = torch.cat([obs[k] for k, _ in self.groups], 1)
        action = torch.minimum(torch.maximum(action, self._act_low), self._act_high)
        member = int(net.elite_idx[torch.randint(net.elite_idx.numel(), (1,), generator=generator,
                                                 device=self.device)])
        noise = None
        if sample and not self.cfg.deterministic:
            noise = torch.randn(x.shape[0], net.out_dim, generator=generator, device=self.device)
        out = net.member_step(x, action, member, noise)
        nxt, _ = self._keep(x, out["next_state"], action)
        return (dict(zip([k for k, _ in self.groups], nxt.split([d for _, d in self.groups], 1))), out["reward"],
                out["p_terminal"])

    def _rssm_observation(self) -> torch.Tensor:
        """The task's flat observation from the decoded one: the new frame appended to the image group's frame
        stack (oldest dropped), the decoded vector in the other groups."""
        n, fc = self.num_envs, self.frame_channels
        frame_dim = self.sim.network.image_dim
        groups = dict(zip([k for k, _ in self.groups], self._obs.split([d for _, d in self.groups], 1)))
        stack = groups[self.image_group].reshape(n, *self.image_shape)
        frame = self.sim.obs[:, :frame_dim].reshape(n, fc, *self.image_shape[1:])
        parts, vector = [], self.sim.obs[:, frame_dim:]
        for k, d in self.groups:
            if k == self.image_group:
                parts.append(torch.cat([stack[:, fc:], frame], 1).reshape(n, -1))
            else:
                parts.append(vector[:, :d])
                vector = vector[:, d:]
        return torch.cat(parts, 1)

    def _observe(self) -> Obs:
        return dict(zip([k for k, _ in self.groups], self._obs.split([d for _, d in self.groups], 1)))

    def _compute(self, action: torch.Tensor) -> StepTerms:
        sim, cfg = self.sim, self.cfg
        limit = math.inf if cfg.max_disagreement is None else cfg.max_disagreement
        terms = {"model": sim.reward}
        if cfg.uncertainty_penalty:
            terms["uncertainty"] = -cfg.uncertainty_penalty * sim.disagreement
        return StepTerms(terms, sim.p_terminal > cfg.terminal_threshold,
                         {"disagreement": sim.disagreement, "p_terminal": sim.p_terminal, "held": self._held},
                         truncated=sim.disagreement > limit,
                         info={"uncertainty": sim.disagreement.clone()})

    def _state_finite(self) -> torch.Tensor:
        return self.sim.finite() & torch.isfinite(self.sim.reward)

    def layout(self):
        return self._layout

    def symmetry_group(self):
        return self._symmetry

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sim": self.sim.get_state(), "obs": self._obs.clone(),
                "starts": self.starts.clone(), "data_range": None if self._data_low is None else
                torch.stack([self._data_low, self._data_high])}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.sim.set_state(state["sim"])
        self._obs = state["obs"].clone().to(self.device)
        self.starts = state["starts"].to(self.device)
        bounds = state["data_range"]
        self._data_low, self._data_high = (None, None) if bounds is None else bounds.to(self.device).unbind(0)
