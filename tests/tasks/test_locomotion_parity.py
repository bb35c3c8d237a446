"""Locomotion tasks equal gymnasium's v5 environments: from identical states and actions, the
observation, reward and termination agree (float32: rtol 1e-6, atol 1e-5; float64 option: 1e-6)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import embodied
from embodied.tasks.locomotion.mujoco_v5 import TASKS_V5

STEPS = {"halfcheetah": 60, "hopper": 60, "walker2d": 60, "ant": 40, "humanoid": 30}


def _sync(ours, theirs, i: int) -> None:
    """Put gymnasium's env in the state of our env ``i`` (both fresh from a reset)."""
    theirs.reset(seed=0)
    theirs.unwrapped.set_state(ours.sim.qpos[i].numpy().copy(), ours.sim.qvel[i].numpy().copy())


@pytest.mark.parametrize("float64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("task", list(TASKS_V5))
def test_matches_gymnasium_v5(task, float64):
    gym_id = TASKS_V5[task][1]
    ours = embodied.make_env(task, num_envs=2, seed=3, obs_float64=float64)
    theirs = gym.make(gym_id)
    tol = dict(rtol=1e-6, atol=1e-6) if float64 else dict(rtol=1e-6, atol=1e-5)
    rng = np.random.default_rng(0)
    obs, _ = ours.reset(seed=3)
    _sync(ours, theirs, 0)
    np.testing.assert_allclose(obs["policy"][0].numpy(), theirs.unwrapped._get_obs(), **tol)
    low, high = theirs.action_space.low, theirs.action_space.high
    compared = 0
    for _ in range(STEPS[task]):
        a = rng.uniform(low, high, size=(2, low.size)).astype(np.float32)
        obs, reward, terminated, truncated, info = ours.step(torch.from_numpy(a))
        o, r, te, _, _ = theirs.step(a[0].astype(np.float64))
        done = bool(terminated[0] or truncated[0])
        last = info["final_obs"]["policy"][0] if done else obs["policy"][0]
        np.testing.assert_allclose(last.numpy(), o, **tol)
        np.testing.assert_allclose(float(reward[0]), r, **tol)
        assert bool(terminated[0]) == te
        compared += 1
        if done:  # our env 0 began a new episode in the same step: follow it
            _sync(ours, theirs, 0)
    assert compared == STEPS[task]
    theirs.close()
