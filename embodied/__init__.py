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


def to_gymnasium(env):
    """Wrap a ``VecEnv`` as a ``gymnasium.vector.VectorEnv`` (numpy in, numpy out)."""
    from embodied.core.adapters import GymnasiumVectorEnv

    return GymnasiumVectorEnv(env)


def to_sb3(env):
    """Wrap a ``VecEnv`` as a Stable-Baselines3 ``VecEnv`` (actor observation group)."""
    from embodied.core.adapters import SB3VecEnv

    return SB3VecEnv(env)


def load_policy(run_dir, device: str = "cpu"):
    """The deterministic policy of a run (latest checkpoint); ``policy.act(obs_policy) -> action``."""
    from embodied.checkpoint import load_policy as _load

    return _load(run_dir, device=device)


__all__ = ["make_env", "to_gymnasium", "to_sb3", "load_policy", "__version__"]
