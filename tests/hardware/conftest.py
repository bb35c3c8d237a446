"""Bundles the hardware tests fly: a short debug run of a task, exported, built once per test session."""

from __future__ import annotations

import numpy as np
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


@pytest.fixture
def plant_state():
    """The state a SITL vehicle's plant is in, as the policy's robot terms (read under the vehicle's lock)."""
    from embodied.hardware.frames import quat_to_rotmat

    def read(vehicle) -> np.ndarray:
        with vehicle.lock:
            sim = vehicle.env.sim
            return np.concatenate([sim.pos_w[0].numpy(), quat_to_rotmat(sim.quat_wb[0].numpy()).reshape(-1),
                                   sim.lin_vel_w[0].numpy(), sim.ang_vel_b[0].numpy()])

    return read


@pytest.fixture
def lagged_error():
    """Per reading, the distance to the nearest of the plant's last ``lag`` states (telemetry lags a period or more on
    a loaded machine)."""

    def error(seen: list[np.ndarray], truths: list[np.ndarray], lag: int = 5) -> list[float]:
        return [min(float(np.abs(s - t).max()) for t in truths[max(0, k - lag):k + 1]) for k, s in enumerate(seen)]

    return error
