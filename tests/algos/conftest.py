"""Shared set-ups of the learner tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import embodied


@pytest.fixture
def mini_libero_demos(tmp_path, minilm):
    """Three expert episodes of mini-libero (``path``, read back as ``data``), a 4-env ``env`` and a learner's
    ``ctx`` over them: the pointer VLA with a continuous head, ``data=path``, the task's relabeller."""
    from embodied.algos.base import BuildContext
    from embodied.config import PolicyConfig, VLAConfig
    from embodied.datasets import collect_demos, read_transitions

    path = tmp_path / "d"
    collect_demos("mini-libero", 3, path, num_envs=3, seed=0)
    env = embodied.make_env("mini-libero", num_envs=4, seed=0)
    ctx = BuildContext(env.single_observation_space, env.single_action_space, 4, torch.device("cpu"), 0, 1000,
                       PolicyConfig(arch="vla", vla=VLAConfig(state_encoder="pointers", head="continuous")),
                       layout=env.layout(), success_metric="success", data=str(path), relabeller=env.relabeller())
    return SimpleNamespace(path=path, env=env, ctx=ctx, data=read_transitions(path, ["policy"]))
