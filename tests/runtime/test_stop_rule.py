"""The stop rule of ``stop_success``: with evaluations of fewer than 200 starts, two in a row must pass
(one 100-start evaluation passes by luck too often); an evaluation of 200 or more decides alone."""

from __future__ import annotations

import pytest
import torch

import embodied.runners.base as runner_base
from embodied.config import load_config
from embodied.runners.base import Runner


class _Actor(torch.nn.Linear):
    def act(self, obs):
        return self(obs)


class _Algo:
    actor_module = _Actor(1, 1)

    def actor(self):
        return self.actor_module


@pytest.mark.parametrize("episodes,passes,successes,stops_at", [
    (100, None, [0.96, 0.50, 0.96, 0.97, 0.99], 3),
    (100, None, [0.94, 0.95, 0.95], 2),
    (200, None, [0.50, 0.96], 1),
    (100, None, [0.5, float(torch.tensor(95 / 100, dtype=torch.float32)), 0.95], 2),  # 95 of 100 in float32
    (200, 2, [0.96, 0.5, 0.96, 0.96], 3),  # stop_passes overrides the default
])
def test_stop_needs_two_passes_in_a_row_below_200_starts(tmp_path, monkeypatch, episodes, passes, successes,
                                                         stops_at):
    cfg = load_config("target", None, ["stop_success=0.95", f"log.eval_episodes={episodes}",
                                        f"stop_passes={'null' if passes is None else passes}",
                                        "log.tensorboard=false", "log.progress=false"])
    results = iter(successes)
    seeds = []

    def fake_evaluate(*a, seed, **k):
        seeds.append(seed)
        return {"eval/success": next(results)}

    monkeypatch.setattr(runner_base, "evaluate", fake_evaluate)
    runner = Runner(cfg, collector=None, algo=_Algo(), make_eval_env=lambda: None, run_dir=tmp_path)
    stops = []
    for k in range(len(successes)):
        runner.step = 1000 * (k + 1)
        stops.append(runner.run_eval())
    assert stops.index(True) == stops_at
    assert len(set(seeds)) == len(seeds)  # every evaluation draws fresh starts
    assert runner.solved_at is not None
    runner.logger.close()
