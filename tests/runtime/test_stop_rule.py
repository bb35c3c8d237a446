"""The stop rule of ``stop_success``: with evaluations of fewer than 200 starts, two in a row must pass
(one 100-start evaluation passes by luck too often); an evaluation of 200 or more decides alone. With
``stop_confirm=now`` a pass the rule needs repeated is confirmed at once on the same policy by 200 more fresh starts
(pooled); with ``next`` (the default) at the following periodic evaluation."""

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


@pytest.mark.parametrize("episodes,passes,confirm,successes,stops_at,evaluations", [
    (100, None, "next", [0.96, 0.50, 0.96, 0.97, 0.99], 3, 4),
    (100, None, "next", [0.94, 0.95, 0.95], 2, 3),
    (200, None, "next", [0.50, 0.96], 1, 2),
    (100, None, "next", [0.5, float(torch.tensor(95 / 100, dtype=torch.float32)), 0.95], 2, 3),  # 95 of 100 in float32
    (200, 2, "next", [0.96, 0.5, 0.96, 0.96], 3, 4),  # stop_passes overrides the default
    # now: a pass is confirmed at once by 200 more starts, pooled (here two 100-start evaluations)
    (100, None, "now", [0.96, 0.50, 0.50, 0.96, 0.97, 0.95], 1, 6),
    (100, None, "now", [0.94, 0.95, 0.99, 0.92], 1, 4),  # 0.92 alone fails; the pooled 0.955 passes
    (100, None, "now", [0.96, 0.99, 0.90, 0.50, 0.97, 0.95, 0.95], 2, 7),  # pooled 0.945 does not pass
    (200, None, "now", [0.50, 0.96], 1, 2),  # one pass is enough: nothing confirmed
    (200, 3, "now", [0.96, 0.96, 0.5, 0.97, 0.96, 0.95], 1, 6),  # 200-start evaluations: one each confirmation
])
def test_stop_needs_two_passes_in_a_row_below_200_starts(tmp_path, monkeypatch, episodes, passes, confirm, successes,
                                                         stops_at, evaluations):
    cfg = load_config("target", None, ["stop_success=0.95", f"log.eval_episodes={episodes}",
                                        f"stop_passes={'null' if passes is None else passes}",
                                        f"stop_confirm={confirm}", "log.tensorboard=false", "log.progress=false"])
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
        if stops[-1]:
            break
    assert stops.index(True) == stops_at
    assert len(seeds) == evaluations
    assert len(set(seeds)) == len(seeds)  # every evaluation draws fresh starts, a repeat at one step too
    assert runner.solved_at == {"step": 1000 * (stops_at + 1), "train_s": 0.0}
    runner.logger.close()


def test_a_first_evaluation_keeps_its_seed():
    """The repeats' seeds are new; an evaluation at a step keeps the seed it had before repeats existed."""
    import numpy as np

    from embodied.evaluate import EVAL_SEED_OFFSET, eval_seed

    cfg = load_config("target", None, ["seed=4"])
    assert eval_seed(cfg, 20000) == int(np.random.SeedSequence([4, EVAL_SEED_OFFSET, 20000]).generate_state(1)[0])
    assert len({eval_seed(cfg, 20000, r) for r in range(3)}) == 3
