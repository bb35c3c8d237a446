"""The MuJoCo locomotion tasks through the adapters: gymnasium's vector API and Stable-Baselines3,
which trains PPO on our halfcheetah for a few thousand steps."""

import numpy as np
import pytest

import embodied
from embodied.tasks.locomotion.mujoco_v5 import TASKS_V5


@pytest.mark.parametrize("task", list(TASKS_V5))
def test_to_gymnasium_steps_every_locomotion_task(task):
    env = embodied.to_gymnasium(embodied.make_env(task, num_envs=2, seed=0))
    obs, _ = env.reset(seed=0)
    assert env.single_observation_space["policy"].contains(obs["policy"][0])
    for _ in range(3):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
    assert reward.shape == (2,) and np.isfinite(obs["policy"]).all()
    env.close()


def test_sb3_ppo_trains_on_halfcheetah():
    from stable_baselines3 import PPO

    venv = embodied.to_sb3(embodied.make_env("halfcheetah", num_envs=4, seed=0))
    model = PPO("MlpPolicy", venv, n_steps=256, batch_size=256, n_epochs=2, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=2048)
    assert model.num_timesteps >= 2048
    action, _ = model.predict(venv.reset(), deterministic=True)
    assert action.shape == (4, 6) and np.isfinite(action).all()


@pytest.mark.parametrize("task", list(TASKS_V5))
def test_task_config_pickles_for_worker_processes(task):
    import pickle

    from embodied.config import load_config

    cfg = load_config(task).env
    assert pickle.loads(pickle.dumps(cfg)) == cfg
