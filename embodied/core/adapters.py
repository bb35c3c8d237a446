"""Thin, exact adapters from the batched torch ``VecEnv`` (DESIGN.md, "Contracts") to the numpy APIs of
other libraries.

- ``GymnasiumVectorEnv``: a ``gymnasium.vector.VectorEnv`` (gymnasium 1.x) over every observation group
  (or the ``"policy"`` group alone, a flat ``Box``), with gymnasium's same-step autoreset conventions for
  ``final_obs`` / ``final_info``, or its next-step autoreset (``SyncVectorEnv``'s default).
- ``SingleEnv``: a ``gymnasium.Env`` over a ``num_envs=1`` VecEnv; an episode end is shown, not
  auto-reset, and the next ``reset()`` starts a new episode.
- ``SB3VecEnv``: a Stable-Baselines3 ``VecEnv`` over the ``"policy"`` group. SB3 is an optional extra
  (``embodied[sb3]``), so the class is built on first access (module ``__getattr__``) and a missing SB3
  is a one-line ``UserError``.

Actions cross into the env as float32 torch tensors on ``env.device``; everything that comes back is a
fresh numpy array the caller may keep (the env never sees it again).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from embodied.core.base import VecEnv
from embodied.core.errors import UserError
from embodied.runtime.base import EpisodeStats

POLICY = "policy"  # the actor observation group (DESIGN.md: always present)
SUCCESS = "success"  # key of info["final_info"] that says an episode succeeded


# ---- conversions --------------------------------------------------------------------------------
def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy copy (never a view of env memory, which the env may overwrite on its next step)."""
    return t.detach().to("cpu", copy=True).numpy()


def _obs_to_numpy(obs: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: _to_numpy(v) for k, v in obs.items()}


def _tree_to_numpy(value: Any) -> Any:
    """Info values: scalar tensors -> Python numbers, other tensors -> numpy, dicts recursively."""
    if isinstance(value, Mapping):
        return {k: _tree_to_numpy(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.item() if value.dim() == 0 else _to_numpy(value)
    return value


def _action_to_torch(env: VecEnv, actions: Any) -> torch.Tensor:
    """``actions: [N, *act_shape]`` (numpy or array-like) -> float32 tensor on ``env.device`` (a copy)."""
    return torch.tensor(np.asarray(actions, dtype=np.float32), device=env.device)


def _check_seed(seed: Any) -> int | None:
    if seed is None or isinstance(seed, (int, np.integer)):
        return None if seed is None else int(seed)
    raise TypeError(f"seed must be an int or None (one generator seeds the whole batch), got {seed!r}")


def _check_no_options(options: Mapping | None) -> None:
    if options:
        raise ValueError(f"embodied envs take no reset options, got {dict(options)!r}")


# ---- gymnasium ----------------------------------------------------------------------------------
OBS_MODES = ("dict", "policy")
AUTORESET_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}


def _check_obs_mode(env: VecEnv, obs: str) -> str:
    if obs not in OBS_MODES:
        raise ValueError(f"obs must be one of {OBS_MODES}, got {obs!r}")
    if obs == POLICY and POLICY not in env.single_observation_space.spaces:
        raise ValueError(f"the env has no {POLICY!r} observation group")
    return obs


def _check_autoreset_mode(autoreset: str | AutoresetMode) -> AutoresetMode:
    if isinstance(autoreset, AutoresetMode) and autoreset in AUTORESET_MODES.values():
        return autoreset
    if isinstance(autoreset, str) and autoreset in AUTORESET_MODES:
        return AUTORESET_MODES[autoreset]
    raise ValueError(
        f"autoreset must be one of {tuple(AUTORESET_MODES)} (or the AutoresetMode members), got {autoreset!r}; "
        "embodied envs always reset a finished episode, so AutoresetMode.DISABLED is not offered"
    )


def _observation_space(env: VecEnv, obs: str) -> gym.spaces.Space:
    return env.single_observation_space[POLICY] if obs == POLICY else env.single_observation_space


class GymnasiumVectorEnv(gym.vector.VectorEnv):
    """``gymnasium.vector.VectorEnv`` (gymnasium 1.x) over a ``VecEnv``; numpy in, numpy out.

    ``obs="dict"`` (default): observations are the dict of all groups (``Dict`` spaces).
    ``obs="policy"``: only the ``"policy"`` group, a flat ``Box`` ``[N, obs_dim]`` (``single_observation_space``
    and ``observation_space`` are Boxes), which gymnasium's observation wrappers and CleanRL-style scripts take.

    ``autoreset="same_step"`` (default, ``AutoresetMode.SAME_STEP``): the observation of a finished env is the
    first of its next episode; when any env finished, ``infos`` hold ``"final_obs"`` (object array ``[N]``, the
    finished env's observation, ``None`` elsewhere) with mask ``"_final_obs"``, and ``"final_info"`` (per-env
    episode outcomes, each key with its own ``"_key"`` mask) with mask ``"_final_info"``.

    ``autoreset="next_step"`` (``AutoresetMode.NEXT_STEP``, gymnasium's default, what ``SyncVectorEnv`` does):

    - the step that ends an episode returns that episode's last observation, its reward and
      ``terminated``/``truncated``; the episode outcomes (e.g. ``"success"``) are top-level ``infos`` keys,
      each ``[N]`` (zero where the env did not finish) with its ``"_key"`` mask;
    - the next ``step`` returns, for that env, the first observation of a new episode with reward ``0`` and
      ``terminated = truncated = False``, and its action is ignored (the new episode starts from that
      observation; ``max_episode_steps`` further steps reach the time limit);
    - ``infos`` never hold ``"final_obs"`` / ``"final_info"``.

    How next-step autoreset is made exact on a batched env that always steps every env: when every env is due
    to reset (e.g. all episodes end together by time limit, or ``num_envs=1``), the inner env is not stepped at
    all: ``reset()`` without a seed (its generator stream goes on) gives the new episodes, exactly what
    ``SyncVectorEnv`` does (with ``num_envs=1`` the results equal, bit for bit, a ``SyncVectorEnv`` over
    ``SingleEnv``). When only some envs are due, the inner env steps the batch with a fixed in-bounds action
    (zero, clipped into the action box) for the envs due to reset, whatever the caller passed, and then
    re-samples their initial state with the task's per-env hooks (``episode_length = 0``, ``_reset_idx``,
    fresh observation for those envs only: the distribution of the inner autoreset; a task with a fused
    step draws these from its tensor generator, not from the fused kernel's stream); so their discarded step
    cannot be seen in their observations, rewards, flags or episode lengths, and the caller's action for them
    has no effect at all.
    What the discarded step can still touch is what the batch shares: ``infos["log"]`` (the inner env's batch
    means include it), ``num_nan_resets``, step counters such as a curriculum's, and the draws taken from the
    shared generator (so, with ``num_envs > 1``, the random stream differs from that of ``num_envs``
    independently seeded single envs, as it does in every mode). This needs the per-env reset hooks of
    ``ManagedVecEnv`` (every registered task has them).

    ``infos["log"]`` is the inner env's batch-averaged log as Python floats (empty on a step where the inner
    env was not stepped). ``reset(seed=int)`` seeds the one generator of the whole batch.
    """

    def __init__(self, env: VecEnv, autoreset: str | AutoresetMode = "same_step", obs: str = "dict"):
        self.env = env
        self.obs_mode = _check_obs_mode(env, obs)
        self.autoreset_mode = _check_autoreset_mode(autoreset)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            missing = [a for a in ("_reset_idx", "_observe", "episode_length") if not hasattr(env, a)]
            if missing:
                raise ValueError(
                    f"autoreset='next_step' re-samples single envs and needs the per-env reset hooks of "
                    f"ManagedVecEnv; {type(env).__name__} lacks {missing}"
                )
        self.num_envs = env.num_envs
        self.single_observation_space = _observation_space(env, obs)
        self.single_action_space = env.single_action_space
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        self.action_space = batch_space(env.single_action_space, env.num_envs)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        space = env.single_action_space
        self._null_action = np.clip(np.zeros(space.shape, dtype=np.float32), space.low, space.high).astype(np.float32)
        self._autoreset = np.zeros(env.num_envs, dtype=np.bool_)  # next_step: envs whose next step is a reset

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        seed = _check_seed(seed)
        _check_no_options(options)
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed)
        self._autoreset[:] = False
        return self._obs(obs), _tree_to_numpy(info)

    def step(self, actions):
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            return self._step_next(actions)
        obs, reward, terminated, truncated, info = self.env.step(_action_to_torch(self.env, actions))
        terminated, truncated = _to_numpy(terminated), _to_numpy(truncated)
        done = terminated | truncated
        infos: dict[str, Any] = {"log": _tree_to_numpy(info.get("log", {}))}
        if done.any():
            final = self._obs(info["final_obs"])
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = final[i] if self.obs_mode == POLICY else {k: v[i] for k, v in final.items()}
            infos["final_obs"], infos["_final_obs"] = final_obs, done.copy()
            infos["final_info"], infos["_final_info"] = self._final_info(info, done), done.copy()
        return self._obs(obs), _to_numpy(reward), terminated, truncated, infos

    def _step_next(self, actions):
        env, n, due = self.env, self.num_envs, self._autoreset
        actions = np.array(actions, dtype=np.float32)  # a copy: the rows of envs due to reset are replaced
        if actions.shape != (n, *self.single_action_space.shape):
            raise ValueError(f"actions shape {actions.shape} != expected {(n, *self.single_action_space.shape)}")
        if due.all():  # every env starts a new episode; nothing is stepped
            obs, _ = env.reset()
            reward = np.zeros(n, dtype=np.float32)
            terminated, truncated = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
            self._autoreset = np.zeros(n, dtype=np.bool_)
            return self._obs(obs), reward, terminated, truncated, {"log": {}}
        actions[due] = self._null_action
        obs, reward, terminated, truncated, info = env.step(_action_to_torch(env, actions))
        reward, terminated, truncated = _to_numpy(reward), _to_numpy(terminated), _to_numpy(truncated)
        if due.any():  # discard the step of the envs due to reset: a fresh episode, as the inner autoreset does
            mask = torch.as_tensor(due, device=env.device)
            ids = mask.nonzero().squeeze(-1)
            env.episode_length[ids] = 0
            env._reset_idx(ids)
            fresh = env._observe()
            obs = {k: torch.where(mask.view(-1, *[1] * (v.dim() - 1)), fresh[k], v) for k, v in obs.items()}
            reward[due], terminated[due], truncated[due] = 0.0, False, False
        done = terminated | truncated
        infos: dict[str, Any] = {"log": _tree_to_numpy(info.get("log", {}))}
        if done.any():  # show the finished episodes' last observation; their reset comes on the next step
            mask = torch.as_tensor(done, device=env.device)
            obs = {
                k: torch.where(mask.view(-1, *[1] * (v.dim() - 1)), info["final_obs"][k], v) for k, v in obs.items()
            }
            infos.update(self._final_info(info, done))
        self._autoreset = done
        return self._obs(obs), reward, terminated, truncated, infos

    def _obs(self, obs: Mapping[str, torch.Tensor]):
        return _to_numpy(obs[POLICY]) if self.obs_mode == POLICY else _obs_to_numpy(obs)

    @staticmethod
    def _final_info(info: Mapping, done: np.ndarray) -> dict[str, np.ndarray]:
        """Per-env outcomes ``[N]``, zero where not done (as gymnasium's ``_add_info`` fills them)."""
        out = {}
        for key, value in info.get("final_info", {}).items():
            value = _to_numpy(value)
            out[key] = np.where(done, value, np.zeros_like(value))
            out[f"_{key}"] = done.copy()
        return out

    def close_extras(self, **kwargs) -> None:
        self.env.close()


class SingleEnv(gym.Env):
    """``gymnasium.Env`` over a ``num_envs=1`` VecEnv (``embodied.make_gym_env`` builds one from a task).

    ``obs="dict"`` (default): the observation is the dict of groups without batch dim; ``obs="policy"``: the
    ``"policy"`` group alone, a flat ``Box``.

    The inner env resets a finished episode inside the same step; this adapter hides that: the step
    that ends an episode returns its last observation (the inner ``info["final_obs"]``) and the per-env
    episode outcomes (e.g. ``"success"``) in ``info``, and ``step`` refuses to continue until ``reset()``.
    ``reset(seed=None)`` continues the env's random stream; an int re-seeds it.
    """

    metadata = {"render_modes": []}

    def __init__(self, env: VecEnv, obs: str = "dict"):
        if env.num_envs != 1:
            raise ValueError(f"SingleEnv needs a VecEnv with num_envs=1, got num_envs={env.num_envs}")
        self.env = env
        self.obs_mode = _check_obs_mode(env, obs)
        self.observation_space = _observation_space(env, obs)
        self.action_space = env.single_action_space
        self._needs_reset = True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        seed = _check_seed(seed)
        _check_no_options(options)
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed)
        self._needs_reset = False
        return self._unbatch(obs), _tree_to_numpy(info)

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("the episode has ended (or never started): call reset() before step()")
        action = _action_to_torch(self.env, action)[None]
        obs, reward, terminated, truncated, info = self.env.step(action)
        term, trunc = bool(terminated[0]), bool(truncated[0])
        out = {"log": _tree_to_numpy(info.get("log", {}))}
        if term or trunc:
            obs = info["final_obs"]  # the inner env already began its next episode; show this one's end
            out.update({k: v[0].item() for k, v in info.get("final_info", {}).items()})
            self._needs_reset = True
        return self._unbatch(obs), float(reward[0]), term, trunc, out

    def _unbatch(self, obs: Mapping[str, torch.Tensor]):
        if self.obs_mode == POLICY:
            return _to_numpy(obs[POLICY][0])
        return {k: _to_numpy(v[0]) for k, v in obs.items()}

    def close(self) -> None:
        self.env.close()


# ---- Stable-Baselines3 --------------------------------------------------------------------------
@functools.cache
def _sb3_vec_env_class() -> type:
    """Build ``SB3VecEnv`` (a subclass of SB3's ``VecEnv``) once, importing SB3 only now."""
    try:
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import VecEnv as SB3BaseVecEnv
    except ImportError:
        raise UserError(
            "Stable-Baselines3 is not installed; install the extra: pip install 'embodied[sb3]'"
        ) from None

    class SB3VecEnv(SB3BaseVecEnv):
        """Stable-Baselines3 ``VecEnv`` over the ``"policy"`` observation group of a ``VecEnv``.

        SB3 conventions on an episode end: ``infos[i]["terminal_observation"]`` is the last
        observation, ``infos[i]["TimeLimit.truncated"]`` is ``truncated and not terminated``,
        ``infos[i]["episode"] = {"r", "l", "t"}`` as ``Monitor`` writes it (so SB3's logger and
        ``evaluate_policy`` see episodes; ``env_is_wrapped(Monitor)`` says so), and
        ``infos[i]["is_success"]`` where the env reports a ``"success"`` outcome.
        All envs of the batch share one env object: attributes and methods are per batch.
        """

        def __init__(self, env: VecEnv):
            if POLICY not in env.single_observation_space.spaces:
                raise ValueError(f"the env has no {POLICY!r} observation group")
            self.env = env  # before super().__init__, which calls get_attr("render_mode")
            super().__init__(env.num_envs, env.single_observation_space[POLICY], env.single_action_space)
            self._actions: np.ndarray | None = None
            self._stats = EpisodeStats(env.num_envs, env.device)
            self._t_start = time.time()

        def reset(self) -> np.ndarray:
            # SB3 gives env i the seed `seed + i`; one generator seeds the whole batch, with env 0's
            seed = self._seeds[0]
            _check_no_options(self._options[0])
            obs, info = self.env.reset(seed=seed)
            self._reset_seeds()
            self._reset_options()
            self.reset_infos = [{} for _ in range(self.num_envs)]
            self._stats.reset()
            return _to_numpy(obs[POLICY])

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = actions

        def step_wait(self):
            action = _action_to_torch(self.env, self._actions)
            obs, reward, terminated, truncated, info = self.env.step(action)
            ended = self._stats.track(reward, terminated | truncated, info.get("final_info"))
            reward, terminated, truncated = _to_numpy(reward), _to_numpy(terminated), _to_numpy(truncated)
            done = terminated | truncated
            time_limit = truncated & ~terminated
            infos = [{"TimeLimit.truncated": bool(time_limit[i])} for i in range(self.num_envs)]
            if ended is not None:
                final = _to_numpy(info["final_obs"][POLICY])
                t = round(time.time() - self._t_start, 6)
                for j, row in enumerate(ended.as_dicts()):
                    i = int(ended.env_ids[j])
                    infos[i]["terminal_observation"] = final[i].copy()
                    infos[i]["episode"] = {"r": row["return"], "l": int(row["length"]), "t": t}
                    if SUCCESS in row:
                        infos[i]["is_success"] = bool(row[SUCCESS])
            return _to_numpy(obs[POLICY]), reward, done, infos

        def seed(self, seed: int | None = None):
            """SB3 convention: applied at the next ``reset()`` (env 0's seed seeds the batch)."""
            return super().seed(seed)

        def close(self) -> None:
            self.env.close()

        def get_images(self):
            return [None] * self.num_envs  # no renderer on embodied VecEnvs yet

        def get_attr(self, attr_name: str, indices=None) -> list:
            if attr_name == "render_mode":
                value = getattr(self.env, "render_mode", None)
            else:
                value = getattr(self.env, attr_name)
            return [value for _ in self._get_indices(indices)]

        def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
            self._check_all(indices, "set_attr")
            setattr(self.env, attr_name, value)

        def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list:
            idx = self._check_all(indices, "env_method")
            result = getattr(self.env, method_name)(*method_args, **method_kwargs)
            return [result for _ in idx]

        def env_is_wrapped(self, wrapper_class: type, indices=None) -> list[bool]:
            # the adapter writes Monitor's episode statistics itself; no gymnasium wrapper is inside
            return [wrapper_class is Monitor for _ in self._get_indices(indices)]

        def _check_all(self, indices, what: str) -> list[int]:
            idx = list(self._get_indices(indices))
            if sorted(idx) != list(range(self.num_envs)):
                raise ValueError(f"{what}: the envs of a batch share one object; pass all indices (or None)")
            return idx

    SB3VecEnv.__module__ = __name__
    SB3VecEnv.__qualname__ = "SB3VecEnv"  # picklable as embodied.core.adapters.SB3VecEnv
    return SB3VecEnv


def __getattr__(name: str):
    # PEP 562: `from embodied.core.adapters import SB3VecEnv` imports SB3 only when asked for
    if name == "SB3VecEnv":
        return _sb3_vec_env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
