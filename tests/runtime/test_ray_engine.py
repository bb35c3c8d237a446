"""The Ray engine on a local Ray instance with 2 CPUs: the sync engine's rollouts, recovery from a
killed actor, and a training run through it."""

import pytest
import torch
from test_engines import assert_same_rollouts_as_sync

from embodied.config import load_config
from embodied.train import train

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_equals_sync_and_recovers_from_a_killed_actor(local_ray):
    from embodied.runtime.ray_engine import RayCollector

    remote = assert_same_rollouts_as_sync(RayCollector, 12)
    try:
        ray.kill(remote._procs[0], no_restart=True)
        for _ in range(3):  # the step in flight may have finished before the kill: noticed a step later
            tr = remote.step(lambda obs: torch.zeros(4, 1))
            if remote.log["runtime/worker_restarts"]:
                break
        assert tr.truncated.all() and remote.log["runtime/worker_restarts"] == 1.0
        tr = remote.step(lambda obs: torch.zeros(4, 1))
        assert torch.isfinite(tr.obs["policy"]).all()
    finally:
        remote.close()


def test_ray_engine_trains(local_ray, tmp_path):
    cfg = load_config("pendulum", "debug", ["runtime.engine=ray", "runtime.num_workers=2", "log.progress=false",
                                            "log.tensorboard=false"])
    _, summary = train(cfg, tmp_path / "run")
    assert summary["step"] >= cfg.total_steps and "eval/return" in summary
