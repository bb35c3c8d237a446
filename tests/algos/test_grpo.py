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


def _grpo(**overrides):
    from embodied.algos.base import BuildContext
    from embodied.algos.grpo import GRPO, GRPOConfig
    from embodied.config import PolicyConfig

    env = embodied.make_env("point-reach", num_envs=4, seed=0)
    ctx = BuildContext(env.single_observation_space, env.single_action_space, 4, torch.device("cpu"), 0, 1000,
                       PolicyConfig(), success_metric="success")
    return GRPO(GRPOConfig(group_size=2, **overrides), ctx)


def _rollout(algo, outcomes, length=3):
    """One episodic rollout of ``length`` steps in which every env's episode ends at the last step with
    ``outcomes`` (success per env)."""
    from embodied.algos.base import Transition

    algo.rollout_starts()
    obs = {"policy": torch.zeros(4, 4)}
    for t in range(length):
        action, extras = algo.act(obs)
        done = torch.full((4,), t == length - 1)
        algo.observe(Transition(obs, action, torch.zeros(4), done, torch.zeros(4, dtype=torch.bool), obs, extras,
                                outcome={"success": torch.tensor(outcomes, dtype=torch.float32)}))
    return algo.update()


def test_dynamic_sampling_waits_for_mixed_groups_then_updates():
    algo = _grpo(batch_groups=2, max_fill_rollouts=3)
    out = _rollout(algo, [1, 1, 0, 0])  # both groups uniform: dropped, nothing to learn from
    assert out["grpo/mixed_groups"] == 0 and "grpo/loss" not in out and algo.pending == []
    out = _rollout(algo, [1, 0, 0, 0])  # one mixed group (3 steps kept): waits for a second
    assert out["grpo/mixed_groups"] == 1 and "grpo/loss" not in out and algo.num_updates == 0
    assert algo.pending[0]["obs"].shape[0] == 2 * 3
    out = _rollout(algo, [0, 0, 1, 0])  # the second: the update runs on both (12 steps)
    assert "grpo/loss" in out and out["grpo/batch_steps"] == 12 and algo.num_updates == 1 and algo.pending == []


def test_dynamic_sampling_gives_up_waiting_after_max_fill_rollouts():
    algo = _grpo(batch_groups=4, max_fill_rollouts=2)
    assert "grpo/loss" not in _rollout(algo, [1, 0, 1, 1])
    out = _rollout(algo, [0, 0, 0, 0])  # two rollouts: it updates on the one mixed group it has
    assert out["grpo/batch_steps"] == 6 and algo.num_updates == 1
    out = _rollout(algo, [0, 0, 0, 0])
    assert "grpo/loss" not in out
    out = _rollout(algo, [1, 1, 1, 1])  # nothing pending after the fill limit: the update is skipped
    assert out.get("grpo/skipped_updates") == 1.0 and algo.num_updates == 1


def test_surrogate_gradient_is_the_advantage_weighted_score_of_the_kept_steps():
    """At the collecting policy (ratio 1) the clipped surrogate's gradient is mean(A * grad log pi) over the kept steps'
    action entries; the rollouts are consumed."""
    algo = _grpo(batch_groups=2, max_fill_rollouts=3)
    _rollout(algo, [1, 0, 1, 1])  # group 0 mixed (its 2 envs x 3 steps kept), group 1 all succeeded: dropped
    batch = {k: v.clone() for k, v in algo.pending[0].items()}
    grad, mixed = algo.surrogate_gradient()
    assert mixed == 1 and algo.pending == [] and algo._kept_groups == 0
    assert torch.allclose(batch["advantage"], torch.tensor([0.5, -0.5] * 3) / math.sqrt(0.5))  # (R - 0.5) / std 0.71
    logp = algo.dist(batch["obs"]).log_prob(batch["action"])  # [6, act_dim]
    expected = torch.autograd.grad((batch["advantage"][:, None] * logp).sum() / logp.numel(),
                                   list(algo.pi.parameters()), allow_unused=True)
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten()
                      for g, p in zip(expected, algo.pi.parameters())])
    assert grad.shape == flat.shape and torch.allclose(grad, flat, atol=1e-7) and grad.norm() > 0
    grad, mixed = algo.surrogate_gradient()  # nothing left
    assert mixed == 0 and torch.equal(grad, torch.zeros_like(grad))


def test_rollouts_keep_camera_entries_as_uint8_and_learn_from_the_same_floats():
    """A policy group with a quantized image term: the pending steps hold its pixels as uint8, and the update's
    inputs are the observed floats exactly."""
    import gymnasium as gym
    import numpy as np

    from embodied.algos.base import BuildContext, Transition
    from embodied.algos.grpo import GRPO, GRPOConfig
    from embodied.config import PolicyConfig
    from tests.core.test_pixels import layout, observations

    side = 36  # the CNN encoder's smallest image
    dim = 3 + 6 * side * side + 2
    ctx = BuildContext(gym.spaces.Dict({"policy": gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)}),
                       gym.spaces.Box(-1, 1, (2,), np.float32), 4, torch.device("cpu"), 0, 1000,
                       PolicyConfig(actor_hidden=[16]), layout=layout(side=side), success_metric="success")
    algo = GRPO(GRPOConfig(group_size=2, batch_groups=2, num_epochs=1), ctx)
    seen, inputs = [], []

    def rollout(seed: int) -> dict:
        algo.rollout_starts()
        for t in range(3):
            obs = {"policy": observations(4, seed=seed + t, side=side)}
            seen.append(obs["policy"][:2])  # group 0's envs: the mixed group below
            action, extras = algo.act(obs)
            algo.observe(Transition(obs, action, torch.zeros(4), torch.full((4,), t == 2),
                                    torch.zeros(4, dtype=torch.bool), obs, extras,
                                    outcome={"success": torch.tensor([1.0, 0.0, 1.0, 1.0])}))
        inputs.clear()  # the update's inputs only, not the rollout's
        return algo.update()

    assert "grpo/loss" not in rollout(0)  # one mixed group of two asked for: kept, waiting
    pending = algo.pending[0]
    assert pending["obs_pixels"].dtype == torch.uint8 and pending["obs"].shape == (6, 5)
    assert torch.equal(algo.packer.unpack(pending), torch.stack(seen).reshape(6, dim))  # step-major
    dist = algo.dist
    algo.dist = lambda o: inputs.append(o) or dist(o)
    out = rollout(10)
    assert out["grpo/batch_steps"] == 12 and math.isfinite(out["grpo/loss"])
    rows = torch.cat(inputs)
    assert rows.shape == (12, dim) and all(any(torch.equal(r, e) for e in torch.cat(seen)) for r in rows)
