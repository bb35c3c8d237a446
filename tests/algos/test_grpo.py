"""GRPO: group advantages, dynamic sampling, the clip-higher objective, shared starts, and learning."""

from __future__ import annotations

import json
import math

import pytest
import torch

import embodied
from embodied.algos.grpo import clipped_objective, group_advantages
from embodied.config import load_config
from embodied.train import train
from tests.floors import FLOORS


def test_group_advantages_and_dynamic_sampling_exact():
    success = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1])
    adv, keep = group_advantages(success, 4)
    # group 0: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    assert torch.equal(adv[4:8], torch.zeros(4))  # all succeeded: no signal
    # group 2: mean 0.5, std sqrt(4 * 0.25 / 3)
    s = math.sqrt(1 / 3)
    assert torch.allclose(adv[8:], torch.tensor([-0.5, 0.5, -0.5, 0.5]) / s, atol=1e-5)
    assert keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4


def test_clipped_objective_hand_values():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = clipped_objective(logp, old, adv, 0.2, 0.28)
    # ratio 1.5: min(1.5, 1.28) for A > 0, min(-1.5, -1.28) for A < 0; ratio 0.5: min(0.5, 0.8), min(-0.5, -0.8)
    assert torch.allclose(out, torch.tensor([1.28, -1.5, 0.5, -0.8]))


def test_shared_starts_are_exact():
    env = embodied.make_env("point-reach", num_envs=6, seed=0)
    obs = env.reset_envs(torch.tensor([5, 5, 5, 9, 9, 2]))["policy"]
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[1], obs[2]) and torch.equal(obs[3], obs[4])
    assert not torch.equal(obs[0], obs[3]) and not torch.equal(obs[3], obs[5])
    again = env.reset_envs(torch.tensor([9, 5, 2, 2, 2, 2]))["policy"]
    assert torch.equal(again[0], obs[3]) and torch.equal(again[1], obs[0]) and torch.equal(again[2], obs[5])


def test_grpo_learns_point_reach(tmp_path):
    cfg = load_config("point-reach", None, ["algo=grpo", "num_envs=64", "total_steps=120000", "log.eval_every=0",
                                      "log.eval_episodes=128", "log.progress=false", "log.tensorboard=false",
                                      "policy.actor_hidden=[64,64]", "grpo.lr=3e-3", "grpo.minibatch_tokens=1024",
                                      "grpo.temperature=1.0"])
    run_dir, summary = train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [r["grpo/rollout_success"] for r in rows if "grpo/rollout_success" in r]
    assert rollouts[0] < 0.3  # it starts far from solved
    assert summary["eval/success"] >= FLOORS["grpo_point_reach_success"]


def test_grpo_needs_groups_that_divide_the_batch_and_a_success_metric(tmp_path):
    from embodied.core.errors import UserError

    with pytest.raises(UserError, match="divide num_envs"):
        train(load_config("point-reach", None, ["algo=grpo", "num_envs=10", "grpo.group_size=4"]), tmp_path / "a")
    with pytest.raises(UserError, match="success"):
        train(load_config("target", None, ["algo=grpo", "num_envs=8"]), tmp_path / "b")
