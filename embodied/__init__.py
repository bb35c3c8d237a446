"""embodied: a robotics and embodied-RL platform.

Public API::

    env = embodied.make_env("quadrotor-hover", num_envs=64, device="cpu", seed=0)
    obs, info = env.reset()
    obs, reward, terminated, truncated, info = env.step(action)
    gym_env = embodied.to_gymnasium(env)     # gymnasium.vector.VectorEnv
    sb3_env = embodied.to_sb3(env)           # stable_baselines3 VecEnv
    policy = embodied.load_policy("runs/quadrotor-hover/<stamp>")
    action = policy.act(obs["policy"])
"""

from __future__ import annotations

__version__ = "0.1.0"


def make_env(task: str, num_envs: int = 1, device: str = "cpu", seed: int = 0, **task_overrides):
    """Build a registered task as a batched ``VecEnv``; keyword overrides set task config fields."""
    import embodied.tasks  # noqa: F401  (registers tasks)
    from embodied.config import make_task_config
    from embodied.core.registry import TASKS

    spec = TASKS.get(task)
    cfg = make_task_config(task, **task_overrides)
    return spec.make(cfg, num_envs=num_envs, device=device, seed=seed)


def to_gymnasium(env, autoreset: str = "same_step", obs: str = "dict"):
    """Wrap a ``VecEnv`` as a ``gymnasium.vector.VectorEnv`` (numpy in, numpy out).

    ``autoreset``: ``"same_step"`` (default; a finished env's observation is already the next episode's, the
    last one is in ``infos["final_obs"]``) or ``"next_step"`` (gymnasium's default, as ``SyncVectorEnv``: the
    step after an episode ends returns the reset observation with reward 0 and ignores that env's action; what
    gymnasium's vector observation wrappers such as ``NormalizeObservation`` require).
    ``obs``: ``"dict"`` (default; all observation groups) or ``"policy"`` (the actor group as a flat ``Box``).
    See ``embodied.core.adapters.GymnasiumVectorEnv`` for the exact conventions.
    """
    from embodied.core.adapters import GymnasiumVectorEnv

    return GymnasiumVectorEnv(env, autoreset=autoreset, obs=obs)


def make_gym_env(task: str, seed: int = 0, device: str = "cpu", obs: str = "dict", **task_overrides):
    """Build a registered task as a single ``gymnasium.Env`` (no autoreset: ``reset()`` after an episode ends).

    ``obs``: ``"dict"`` (default; all observation groups) or ``"policy"`` (the actor group as a flat ``Box``).
    Keyword overrides set task config fields, as in ``make_env``; ``seed`` seeds the env's generator
    (``reset(seed=...)`` re-seeds it). ``gymnasium.vector.SyncVectorEnv([lambda: make_gym_env(...)])`` works.
    """
    from embodied.core.adapters import SingleEnv

    return SingleEnv(make_env(task, num_envs=1, device=device, seed=seed, **task_overrides), obs=obs)


def to_sb3(env):
    """Wrap a ``VecEnv`` as a Stable-Baselines3 ``VecEnv`` (actor observation group)."""
    from embodied.core.adapters import SB3VecEnv

    return SB3VecEnv(env)


def load_policy(run_dir, device: str = "cpu"):
    """The deterministic policy of a run (latest checkpoint); ``policy.act(obs_policy) -> action``."""
    from embodied.checkpoint import load_policy as _load

    return _load(run_dir, device=device)


__all__ = ["make_env", "make_gym_env", "to_gymnasium", "to_sb3", "load_policy", "__version__"]
