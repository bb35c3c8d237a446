"""Core contracts: the batched VecEnv every task implements (DESIGN.md, "Contracts").

Batched first: every tensor has a leading ``num_envs`` dimension and lives on ``env.device``.
Observations are a dict of groups (``"policy"`` always, ``"critic"`` for privileged state).
``step`` returns ``(obs, reward[N], terminated[N], truncated[N], info)``; finished envs are reset
inside the same step and the last observation of the finished episode is in ``info["final_obs"]``.
Per-term rewards and task metrics are in ``info["log"]`` (scalars, averaged over the batch).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from embodied.core.errors import UserError

# key of an episode's outcome (``final_info``) that says which task of a suite it was, where one env holds a mix
TASK_ID = "task_id"
# keys of an episode's outcome that name the entities its instruction is about, as indices into the entities a
# pointer policy points at (the state terms of a kind that occurs more than once, in layout order; -1: none): what
# the episode is to move, and what it is to put it onto. The task's own knowledge (its success predicate's
# arguments), for training-time labels only: a policy never observes them
INSTRUCTED = ("instructed_object", "instructed_support")

Obs = dict[str, torch.Tensor]


def resolve_device(device: str | torch.device) -> torch.device:
    """A requested device that is missing is an error, never a silent fallback."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:i]'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:i]'")
    if dev.type == "cuda":  # 'cuda' names the current device: its index, so that tensors' devices compare equal
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise UserError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} GPU(s)")
        dev = torch.device("cuda", index)
    return dev


class VecEnv(abc.ABC):
    """A batch of ``num_envs`` environments stepping in lock-step on one ``device``."""

    num_envs: int
    device: torch.device
    single_observation_space: gym.spaces.Dict  # per env, one Box per obs group
    single_action_space: gym.spaces.Box  # per env
    max_episode_steps: int
    control_dt: float  # [s] simulated time per control step; every task declares it (video playback rate)
    # a suite of tasks (each env draws one at every reset, and its episodes report it as the outcome's ``TASK_ID``):
    # how many; ``reset_envs(seeds, tasks)`` can then be told each env's task. 0: one task
    num_tasks: int = 0

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> tuple[Obs, dict]:
        """Reset every env. ``seed`` re-seeds the env's generator."""

    @abc.abstractmethod
    def step(
        self, action: torch.Tensor
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Advance all envs by one control step. ``action: [N, act_dim]`` in the action space."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def symmetry_group(self):
        """The task's symmetry group (``embodied.core.symmetry.SymmetryGroup``), or None."""
        return None

    def relabeller(self):
        """How recorded episodes of this suite can be relabelled as episodes of other instructions
        (``embodied.core.relabel.Relabeller``), or None."""
        return None

    def layout(self):
        """What each observation and action entry means (``embodied.core.layout.Layout``): export writes it
        into the deploy bundle. A task that declares none gets one unnamed term per group."""
        from embodied.core.layout import generic_layout

        return generic_layout({g: s.shape for g, s in self.single_observation_space.spaces.items()},
                              self.single_action_space.shape, self.control_dt)

    # a simulated robot's own plant (``sim://<task>?mass=1.2``): names of the physical parameters a task lets
    # a user scale, and the scaling (multipliers of the nominal values, for every episode that starts after it)
    def plant_parameters(self) -> tuple[str, ...]:
        return ()

    def scale_plant(self, **factors: float) -> None:
        if factors:
            raise UserError(f"task {type(self).__name__} has no plant parameters to scale "
                            f"(got {', '.join(factors)})")

    # rendering: a task that draws overrides ``render_frame``; ``can_render`` says whether it does
    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        """RGB frame ``uint8 [H, W, 3]`` of env ``env_idx`` in its current state."""
        raise UserError(f"task {type(self).__name__} has no renderer")

    @property
    def can_render(self) -> bool:
        """Whether ``render_frame`` draws (the task overrides it) rather than raising ``UserError``."""
        return type(self).render_frame is not VecEnv.render_frame

    # restorable states (episodes started from a recorded state, e.g. part-way through a demonstration): a task that
    # can put an env back into an exact recorded state overrides both
    def env_states(self) -> torch.Tensor | None:
        """``[N, S]`` float64: each env's exact state as one row (``restore_envs`` continues from it), or None where the
        task cannot restore states."""
        return None

    def restore_envs(self, env_ids: torch.Tensor, rows: torch.Tensor) -> Obs:
        """Put envs ``env_ids`` into the states ``rows`` (``env_states``' rows) as new episodes; the observation of
        every env."""
        raise UserError(f"task {type(self).__name__} cannot restore recorded states")

    # checkpointing: everything needed to continue the env stream exactly
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:  # noqa: B027 - optional hook
        pass


@dataclass
class StepTerms:
    """What a task computes after physics for one step (all ``[N]``)."""

    reward_terms: dict[str, torch.Tensor]  # weighted terms; the reward is their sum
    terminated: torch.Tensor  # bool
    metrics: dict[str, torch.Tensor] | None = None  # extra per-env scalars to average into info["log"]
    # bool: episodes the task cuts short besides the time limit (a learned model's uncertainty), or None
    truncated: torch.Tensor | None = None
    info: dict[str, torch.Tensor] | None = None  # per-env ``[N]`` values handed on as ``info[key]``


def sum_terms(terms: dict[str, torch.Tensor], num_envs: int, device: torch.device) -> torch.Tensor:
    """``[N]``: the reward terms added in order, from zero (the reward ``ManagedVecEnv.step`` returns)."""
    total = torch.zeros(num_envs, device=device)
    for value in terms.values():
        total += value
    return total


class ManagedVecEnv(VecEnv):
    """The step template shared by every task: physics, reward terms, termination, truncation,
    same-step autoreset with ``final_obs``, and recovery from numerical faults.

    A task implements ``_apply_action``, ``_physics_step``, ``_observe``, ``_compute`` and
    ``_reset_idx``; this class owns the bookkeeping so no task repeats it.
    """

    def __init__(self, num_envs: int, device: str | torch.device, seed: int, max_episode_steps: int):
        if num_envs < 1:
            raise UserError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.device = resolve_device(device)
        self.max_episode_steps = int(max_episode_steps)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self.num_nan_resets = 0  # numerical faults caught and recovered from, since construction
        self.reset_task: int | None = None  # a suite's task for the env ``reset_envs`` resets now (None: drawn)
        self._all_ids = torch.arange(self.num_envs, device=self.device)

    # ---- task hooks -------------------------------------------------------------------------
    @abc.abstractmethod
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        """Sample initial states for ``env_ids`` (long ``[K]``)."""

    @abc.abstractmethod
    def _apply_action(self, action: torch.Tensor) -> None:
        """Map the normalized action to controls and advance physics one control step."""

    @abc.abstractmethod
    def _observe(self) -> Obs:
        """Observation groups for all envs."""

    @abc.abstractmethod
    def _compute(self, action: torch.Tensor) -> StepTerms:
        """Reward terms, termination and metrics after the physics step."""

    def _state_finite(self) -> torch.Tensor:
        """``[N]`` bool: physics state of each env is finite. Override where the sim has state."""
        return torch.ones(self.num_envs, dtype=torch.bool, device=self.device)

    # ---- public API -------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[Obs, dict]:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.episode_length.zero_()
        self._reset_idx(self._all_ids)
        return self._observe(), {}

    def reset_envs(self, seeds: torch.Tensor, tasks: torch.Tensor | None = None) -> Obs:
        """Reset every env, env ``i`` from its own seed ``seeds[i]``: its initial state is a function of that seed
        alone, so envs given the same seed start in exactly the same state (a GRPO group). The env's generator
        is left as it was. A suite (``num_tasks`` > 0) can be given each env's task, ``tasks[i]`` in
        ``[0, num_tasks)``: the start is then that of the seed with the task it names (``_reset_idx`` reads
        ``reset_task``, the rest of the draw is the seed's)."""
        seeds = torch.as_tensor(seeds).reshape(-1)
        if seeds.numel() != self.num_envs:
            raise ValueError(f"reset_envs takes {self.num_envs} seeds, got {seeds.numel()}")
        if tasks is not None:
            tasks = torch.as_tensor(tasks).reshape(-1)
            if not self.num_tasks:
                raise UserError(f"task {type(self).__name__} is not a suite of tasks: its envs cannot be told theirs")
            if tasks.numel() != self.num_envs or not bool(((tasks >= 0) & (tasks < self.num_tasks)).all()):
                raise ValueError(f"reset_envs takes {self.num_envs} tasks in [0, {self.num_tasks}), got {tasks}")
        kept = self.generator.get_state()
        try:
            for i, s in enumerate(seeds.tolist()):
                self.generator.manual_seed(int(s))
                self.reset_task = None if tasks is None else int(tasks[i])
                self._reset_idx(self._all_ids[i:i + 1])
        finally:
            self.reset_task = None
            self.generator.set_state(kept)
        self.episode_length.zero_()
        return self._observe()

    def step(self, action: torch.Tensor):
        action = self._check_action(action)
        self._apply_action(action)
        self.episode_length += 1
        terms = self._compute(action)
        reward = sum_terms(terms.reward_terms, self.num_envs, self.device)
        terminated = terms.terminated
        truncated = self.episode_length >= self.max_episode_steps
        if terms.truncated is not None:
            truncated = truncated | (terms.truncated & ~terminated)
        # numerical faults: a non-finite state or reward ends the episode as truncated (no
        # bootstrap from garbage), the reward is zeroed, the env is reset, and the fault counted
        bad = ~self._state_finite() | ~torch.isfinite(reward)
        num_bad = int(bad.sum()) if bad.any() else 0
        if num_bad:
            self.num_nan_resets += num_bad
            reward = torch.where(bad, torch.zeros_like(reward), reward)
            terminated = terminated & ~bad
            truncated = truncated | bad
        done = terminated | truncated
        obs = self._observe()
        log = {f"reward/{k}": v.mean() for k, v in terms.reward_terms.items()}
        if terms.metrics:
            log.update({k: v.float().mean() for k, v in terms.metrics.items()})
        log["nan_resets"] = float(num_bad)
        info = {"log": log, "faulted": bad, **(terms.info or {})}
        if done.any():
            final_obs = {k: v.clone() for k, v in obs.items()}
            if num_bad:  # never hand non-finite observations to a learner
                final_obs = {k: torch.nan_to_num(v, 0.0, 0.0, 0.0) for k, v in final_obs.items()}
            ids = done.nonzero().squeeze(-1)
            info["final_info"] = self._final_info(done)
            self.episode_length[ids] = 0
            self._reset_idx(ids)
            fresh = self._observe()
            # envs that did not finish keep the observation already computed (and its noise)
            obs = {k: torch.where(done.view(-1, *[1] * (v.dim() - 1)), fresh[k], v) for k, v in obs.items()}
            info["final_obs"] = final_obs
        else:
            info["final_obs"] = obs
        return obs, reward, terminated, truncated, info

    def _restore_idx(self, env_ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Put ``env_ids`` into the recorded states ``rows`` (a task that overrides ``env_states`` implements it)."""
        raise UserError(f"task {type(self).__name__} cannot restore recorded states")

    def restore_envs(self, env_ids: torch.Tensor, rows: torch.Tensor) -> Obs:
        env_ids = torch.as_tensor(env_ids, device=self.device).reshape(-1)
        if rows.shape[0] != env_ids.numel():
            raise ValueError(f"restore_envs: {env_ids.numel()} envs, {rows.shape[0]} states")
        env_ids, order = env_ids.sort()  # ascending (batched simulators take sorted ids)
        if bool((env_ids[1:] == env_ids[:-1]).any()):
            raise ValueError("restore_envs: an env given twice")
        rows = rows[order.to(rows.device)]
        self._restore_idx(env_ids, rows)
        self.episode_length[env_ids] = 0
        return self._observe()

    def _final_info(self, done: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-env episode outcome for the envs that just finished (``[N]``, valid where ``done``)."""
        return {}

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(action, dtype=torch.float32, device=self.device)
        expected = (self.num_envs, *self.single_action_space.shape)
        if tuple(action.shape) != expected:
            raise ValueError(f"action shape {tuple(action.shape)} != expected {expected}")
        if action.device != self.device:
            raise ValueError(f"action on {action.device}, env on {self.device}")
        return action if action.dtype is torch.float32 else action.to(torch.float32)  # .to costs 1.3 us as a no-op

    def state_dict(self) -> dict:
        return {
            "generator": self.generator.get_state(),
            "episode_length": self.episode_length.clone(),
            "num_nan_resets": self.num_nan_resets,
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.generator.set_state(state["generator"])
        self.episode_length.copy_(state["episode_length"])
        self.num_nan_resets = int(state["num_nan_resets"])


def box(low, high, shape) -> gym.spaces.Box:
    return gym.spaces.Box(low=low, high=high, shape=tuple(shape), dtype=np.float32)
