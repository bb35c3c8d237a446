"""Engines: the async engine gives the sync engine's rollouts for the same seed and fixed actions,
recovers from a killed worker, and trains through the CLI."""

import os
import signal

import torch

from embodied.config import RuntimeConfig, load_config
from embodied.evaluate import TaskEnvFactory
from embodied.runtime import AsyncCollector, SyncCollector
from embodied.train import train


def _factory(task="pendulum", **overrides):
    cfg = load_config(task, overrides=[f"env.{k}={v}" for k, v in overrides.items()])
    return TaskEnvFactory(task, cfg.env, "cpu")


def _fixed_actions(steps: int, n: int):
    g = torch.Generator().manual_seed(7)
    return [torch.rand(n, 1, generator=g) * 2 - 1 for _ in range(steps)]


def _rollout(collector, actions):
    """``actions[k]`` is the k-th action asked for (the async engine asks for step t+1's during step t)."""
    collector.reset(seed=3)
    stream = iter(actions + actions[-1:])
    out = []
    for _ in range(len(actions)):
        tr = collector.step(lambda obs: next(stream))
        out.append((tr.obs["policy"], tr.reward, tr.terminated, tr.truncated, tr.next_obs["policy"]))
    return out


def assert_same_rollouts_as_sync(engine_cls, steps: int):
    """``engine_cls`` with one worker gives the sync engine's transitions and episodes, bit for bit;
    returns the (open) collector for further checks."""
    make = _factory(episode_steps=7)  # crosses an episode end every 7 steps
    actions = _fixed_actions(steps, 4)
    sync = SyncCollector(make, 4, seed=3, learner_device="cpu")
    other = engine_cls(make, 4, seed=3, learner_device="cpu", runtime=RuntimeConfig(num_workers=1))
    for a, b in zip(_rollout(sync, actions), _rollout(other, actions)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert sync.pop_episodes() == other.pop_episodes()
    return other


def test_async_equals_sync_for_fixed_actions():
    assert_same_rollouts_as_sync(AsyncCollector, 20).close()


def test_killed_worker_is_restarted_and_its_episodes_truncated():
    collector = AsyncCollector(_factory(), 4, seed=0, learner_device="cpu", runtime=RuntimeConfig(num_workers=2))
    try:
        collector.reset(seed=0)
        act = lambda obs: torch.zeros(4, 1)  # noqa: E731
        for _ in range(3):
            collector.step(act)
        os.kill(collector._procs[1].pid, signal.SIGKILL)
        collector._procs[1].join()
        tr = collector.step(act)  # the step in flight when the worker died...
        if not tr.truncated.any():  # ...unless it had answered that step before the kill: then the next one
            tr = collector.step(act)
        assert tr.truncated[2:].all() and not tr.truncated[:2].any() and (tr.reward[2:] == 0).all()
        assert collector.log["runtime/worker_restarts"] == 1.0
        for _ in range(3):  # training goes on with the restarted worker
            tr = collector.step(act)
            assert torch.isfinite(tr.obs["policy"]).all()
        assert collector.restarts == [0, 1]
    finally:
        collector.close()


def test_async_engine_trains_on_and_off_policy(tmp_path):
    for algo in ("ppo", "td3"):
        cfg = load_config("pendulum", "debug", [f"algo={algo}", "runtime.engine=async", "runtime.num_workers=2",
                                                "log.progress=false", "log.tensorboard=false"])
        run_dir, summary = train(cfg, tmp_path / algo)
        assert summary["step"] >= cfg.total_steps and "eval/return" in summary
        lags = [row for row in map(eval_json, (run_dir / "metrics.jsonl").read_text().splitlines())
                if "env/runtime/policy_lag" in row]
        assert lags and all(0.0 <= r["env/runtime/policy_lag"] <= (1.0 if algo == "ppo" else 64.0) for r in lags)
        assert lags[-1]["env/runtime/policy_lag_max"] >= 1.0 and lags[-1]["env/runtime/policy_lag_mean"] > 0.0


def eval_json(line: str) -> dict:
    import json

    return json.loads(line)


def test_async_marks_the_transition_after_a_dropped_step_fresh():
    # a checkpoint drains the step in flight and drops it: the next transition does not follow the
    # last one returned, and says so (Transition.fresh), so n-step windows are not linked across it
    collector = AsyncCollector(_factory(), 4, seed=0, learner_device="cpu", runtime=RuntimeConfig(num_workers=2))
    try:
        collector.reset(seed=0)
        act = lambda obs: torch.zeros(4, 1)  # noqa: E731
        assert collector.step(act).fresh is None
        last = collector.step(act)
        state = collector.state_dict()
        after = collector.step(act)
        assert after.fresh is not None and bool(after.fresh.all())
        assert not torch.equal(after.obs["policy"], last.next_obs["policy"])  # the dropped step lies between
        assert collector.step(act).fresh is None
        collector.load_state_dict(state)
        assert bool(collector.step(act).fresh.all())
    finally:
        collector.close()
