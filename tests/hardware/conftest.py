"""Bundles the hardware tests fly: a short debug run of a task, exported, built once per test session."""

from __future__ import annotations

import pytest

from embodied.config import load_config
from embodied.hardware import export_run
from embodied.train import train


def debug_bundle(root, task: str, fmt: str = "all"):
    cfg = load_config(task, "debug", ["total_steps=512", "log.progress=false", "log.tensorboard=false"])
    run_dir, _ = train(cfg, root / "run")
    export_run(run_dir, root / "bundle", fmt)
    return root / "bundle"


@pytest.fixture(scope="session")
def rpm_bundle(tmp_path_factory):
    """quadrotor-hover (four rotor speeds; the equivariant TD3 actor), ONNX and C."""
    return debug_bundle(tmp_path_factory.mktemp("rpm"), "quadrotor-hover")


@pytest.fixture(scope="session")
def rates_bundle(tmp_path_factory):
    """quadrotor-hover-rates (collective thrust + body rates), ONNX and C."""
    return debug_bundle(tmp_path_factory.mktemp("rates"), "quadrotor-hover-rates")
