"""Analytic policy gradient (``algo=apg``): the loss's exact value, model steps counted as the run's steps, a resumed
run that is the uninterrupted one, a task without a differentiable model refused in one line, and quadrotor-hover
learned from scratch through its model to a survival floor."""

from __future__ import annotations

import pytest
import torch

from embodied.algos.apg import discounted_loss
from embodied.checkpoint import load_checkpoint
from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.train import build, resume, train

QUIET = ["log.progress=false", "log.tensorboard=false"]


def test_discounted_loss_is_the_barrier_less_the_reward_discounted():
    reward = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    margin = torch.tensor([[0.2, 0.05], [-0.1, 0.3]])
    # start 0: -1 + 0.5 (10 * 0.2^2 - 3) = -2.3; start 1: (10 * 0.05^2 - 2) + 0.5 (-4) = -3.975
    loss = discounted_loss(reward, margin, gamma=0.5, barrier=10.0, barrier_margin=0.1)
    assert loss.item() == pytest.approx((-2.3 - 3.975) / 2, abs=1e-6)


def small(tmp_path, name, steps, extra=()):
    return load_config("quadrotor-hover", None, [*QUIET, "algo=apg", "apg.batch_size=8", "apg.horizon=5",
                                                 "apg.restart=0.5", f"total_steps={steps}", "log.eval_every=0",
                                                 "log.eval_episodes=4", "log.checkpoint_every=0",
                                                 "env.domain_randomization.enabled=true", *extra])


def test_an_update_counts_its_model_steps_and_a_resumed_run_is_the_uninterrupted_one(tmp_path):
    torch.set_num_threads(1)
    whole, summary = train(small(tmp_path, "whole", 240), tmp_path / "whole")
    assert summary["step"] == 240  # six updates of 8 flights x 5 steps
    state = load_checkpoint(whole)["algo"]
    assert state["num_updates"] == 6 and int(state["flight"].steps.max()) <= 30
    half, _ = train(small(tmp_path, "half", 120), tmp_path / "half")
    resume(half, total_steps=240)
    again = load_checkpoint(half)["algo"]
    for key, value in state["pi"].items():
        assert torch.equal(value, again["pi"][key]), key
    assert torch.equal(state["flight"].x, again["flight"].x)


def test_an_ensemble_of_apg_learners_counts_each_update_once(tmp_path):
    # members in processes: each member's update is worth its model steps, and the ensemble's update is the members'
    _, summary = train(small(tmp_path, "ens", 80, ["ensemble=2"]), tmp_path / "ens")
    assert summary["step"] == 80  # two updates of 8 flights x 5 steps


def test_a_non_finite_loss_is_a_counted_fault_without_a_step(tmp_path):
    (tmp_path / "nan").mkdir()
    algo = build(small(tmp_path, "nan", 80), tmp_path / "nan").algo
    before = {k: v.clone() for k, v in algo.pi.state_dict().items()}
    rollout = algo.model.rollout

    def faulty(*args, **kw):  # a flight's state went non-finite
        out = rollout(*args, **kw)
        out.reward[3, 2] = float("nan")
        return out

    algo.model.rollout = faulty
    assert algo.update() == {"apg/faults": 1.0} and algo.flight is None
    assert all(torch.equal(v, algo.pi.state_dict()[k]) for k, v in before.items())
    algo.model.rollout = rollout
    metrics = algo.update()  # fresh flights, a normal step
    assert metrics["apg/faults"] == 1.0 and algo.flight is not None and algo.num_updates == 1


def test_a_linear_schedule_anneals_the_rate_by_the_model_steps_flown(tmp_path):
    (tmp_path / "lin").mkdir()
    algo = build(small(tmp_path, "lin", 160, ["apg.lr=2e-3", "apg.lr_schedule=linear"]), tmp_path / "lin").algo
    for k in range(3):  # each update flies 40 of the run's 160 model steps; the rate is set before its step
        algo.update()
        assert algo.opt.param_groups[0]["lr"] == pytest.approx(2e-3 * (1 - 40 * k / 160), rel=1e-12)
    with pytest.raises(UserError, match="apg.lr_schedule must be constant or linear"):
        build(small(tmp_path, "bad", 160, ["apg.lr_schedule=cosine"]), tmp_path / "lin")


def test_a_task_without_a_model_is_refused(tmp_path):
    cfg = load_config("pendulum", "debug", [*QUIET, "algo=apg"])
    with pytest.raises(UserError, match="differentiable model"):
        build(cfg, tmp_path)


def test_apg_learns_to_stay_up_from_scratch(tmp_path):
    """quadrotor-hover through its model from a random actor: 80 updates of 64 flights x 60 steps (307,200 model
    steps, ~25 s); the evaluation's mean episode length rises from ~40 steps (a crash in 0.4 s) to most of the 500."""
    torch.set_num_threads(1)
    cfg = load_config("quadrotor-hover", None, [*QUIET, "algo=apg", "apg.batch_size=64", "apg.horizon=60",
                                                "apg.restart=0.1", "apg.lr=1e-3", "total_steps=307200",
                                                "log.eval_every=0", "log.checkpoint_every=0", "seed=0"])
    _, summary = train(cfg, tmp_path / "run")
    assert summary["eval/length"] >= 300, summary
