"""DAgger distillation (``algo=distill``): the teacher acts with probability beta and every visited state is stored
with the teacher's action exactly; several runs joined by commas teach as their action mean; the state round-trips;
a bad teacher is one line; a student distilled from a trained TD3 policy on ``target`` scores above a floor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embodied import load_policy
from embodied.algos.distill import Distill, load_teacher
from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.policies import EnsembleActor
from embodied.train import build, train

QUIET = ["log.progress=false", "log.tensorboard=false", "log.checkpoint_every=0"]


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> list[Path]:
    """Two TD3 runs on target (the single learner's learning-test budget), seeds 0 and 1."""
    root = tmp_path_factory.mktemp("teachers")
    torch.set_num_threads(1)
    runs = []
    for seed in (0, 1):
        cfg = load_config("target", None, [*QUIET, "algo=td3", "num_envs=32", "total_steps=2560", "log.eval_every=0",
                                           "td3.warmup_steps=320", "td3.batch_size=128", "td3.updates_per_step=0.25",
                                           f"seed={seed}"])
        run_dir, _ = train(cfg, root / f"td3_{seed}")
        runs.append(run_dir)
    return runs


def _distill(teachers, tmp_path, name: str, extra: list[str]):
    (tmp_path / name).mkdir()
    cfg = load_config("target", None, [*QUIET, "algo=distill", f"base={','.join(map(str, teachers))}", "num_envs=16",
                                       *extra])
    return build(cfg, tmp_path / name)


def test_teacher_acts_with_beta_and_labels_every_state(teachers, tmp_path):
    runner = _distill(teachers, tmp_path, "run", ["distill.beta_start=1.0", "distill.beta_steps=1000000"])
    try:
        algo: Distill = runner.algo
        assert isinstance(algo.teacher, EnsembleActor) and len(algo.teacher.members) == 2
        runner.start()
        obs = runner.collector.obs
        mean = (load_policy(teachers[0]).act(obs["policy"]) + load_policy(teachers[1]).act(obs["policy"])) / 2
        assert torch.allclose(algo.act(obs), mean, atol=1e-6)  # beta ~ 1: the teacher (the two runs' mean) acts
        tr = runner.collect()
        rows = algo.storage[:algo.size]
        assert algo.size == 16 and torch.equal(rows[:, :2], tr.obs["policy"])
        assert torch.allclose(rows[:, 2:], mean, atol=1e-6)  # stored with the teacher's action
        state = algo.state_dict()
    finally:
        runner.collector.close()
    twin = _distill(teachers, tmp_path, "twin", [])
    try:
        twin.algo.load_state_dict(state)
        assert torch.equal(twin.algo.storage[:16], rows) and twin.algo.num_observed == 16
    finally:
        twin.collector.close()


def test_one_teacher_and_bad_teachers(teachers, tmp_path):
    assert not isinstance(load_teacher(str(teachers[0]), 2, 2), EnsembleActor)
    with pytest.raises(UserError, match="reads 2 observation entries"):
        load_teacher(str(teachers[0]), 3, 2)
    with pytest.raises(UserError):
        load_teacher(str(tmp_path / "no_such_run"), 2, 2)
    with pytest.raises(UserError, match="teacher"):
        load_teacher(" , ", 2, 2)
    with pytest.raises(UserError, match="symmetry group"):  # target declares none: refused, as td3 and apg refuse it
        _distill(teachers, tmp_path, "sym", ["policy.symmetrize=true"])


def test_student_learns_target_from_two_teachers(teachers, tmp_path, floors):
    """A fresh student distilled from the two runs' mean for 1600 env steps scores above the floor."""
    cfg = load_config("target", None, [*QUIET, "algo=distill", f"base={teachers[0]},{teachers[1]}", "num_envs=16",
                                       "total_steps=1600", "log.eval_every=0", "distill.warmup_steps=320",
                                       "distill.beta_steps=800", "seed=0"])
    _, summary = train(cfg, tmp_path / "student")
    assert summary["step"] == 1600
    assert summary["eval/return"] >= floors["distill_target"], summary
