"""Task sampling by failures: an episodic learner on a suite draws each rollout group's task with probability
``(1 - mix) f_t / sum f + mix / T`` from its fresh-start episodes' failure rates ``f``, and the envs start in it."""

from __future__ import annotations

import json

import pytest
import torch

import embodied
from embodied.algos.task_sampling import TaskSampler, TaskSamplingConfig
from embodied.core.errors import UserError


def test_the_draw_follows_the_failure_rates_exactly():
    ts = TaskSampler(TaskSamplingConfig(by="failures", mix=0.25, rate=0.5), num_tasks=4, seed=0, name="x")
    assert torch.equal(ts.probabilities(), torch.full((4,), 0.25, dtype=torch.float64))  # none seen: all failing
    log = ts.update(torch.tensor([0, 0, 1, 2]), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    # first rollouts set the rates: f = [0.5, 0, 1, 1 (not seen: failing)], sum 2.5
    assert ts.fail.tolist() == [0.5, 0.0, 1.0, 1.0] and ts.seen.tolist() == [True, True, True, False]
    assert torch.allclose(ts.probabilities(), torch.tensor([0.2125, 0.0625, 0.3625, 0.3625], dtype=torch.float64))
    assert log == pytest.approx({"task_sampling/max_share": 0.3625, "task_sampling/min_share": 0.0625}, abs=1e-12)
    ts.update(torch.tensor([0, 3]), torch.tensor([1.0, 0.0]))  # task 0: 0.5 + 0.5 (0 - 0.5); task 3 set to 1
    assert ts.fail.tolist() == [0.25, 0.0, 1.0, 1.0]
    expected = 0.75 * torch.tensor([0.25, 0.0, 1.0, 1.0], dtype=torch.float64) / 2.25 + 0.0625
    assert torch.allclose(ts.probabilities(), expected)
    assert abs(float(ts.probabilities().sum()) - 1.0) < 1e-12
    draws = ts.sample(20000)
    freq = torch.bincount(draws, minlength=4).double() / 20000
    assert (freq - expected).abs().max() < 0.015
    again = TaskSampler(TaskSamplingConfig(by="failures", mix=0.25, rate=0.5), num_tasks=4, seed=7, name="x")
    again.load_state_dict(ts.state_dict())
    assert torch.equal(again.sample(50), ts.sample(50))
    with pytest.raises(UserError, match="report their task"):
        ts.update(torch.tensor([-1]), torch.tensor([1.0]))
    with pytest.raises(UserError, match="uniform or failures"):
        TaskSampler(TaskSamplingConfig(by="hard"), 4, 0, "x")
    with pytest.raises(UserError, match="suite of tasks"):
        TaskSampler(TaskSamplingConfig(by="failures"), 0, 0, "grpo")
    with pytest.raises(UserError, match="mix in"):
        TaskSampler(TaskSamplingConfig(by="failures", mix=1.5), 4, 0, "x")


def test_rollout_groups_start_in_the_tasks_drawn(minilm):
    from embodied.algos.base import BuildContext
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.config import PolicyConfig
    from embodied.runtime.sync import SyncCollector

    env = embodied.make_env("mini-libero", num_envs=8, seed=0)
    collector = SyncCollector(lambda n, seed: env, 8, 0, "cpu")
    ctx = BuildContext(env.single_observation_space, env.single_action_space, 8, torch.device("cpu"), 0, 1000,
                       PolicyConfig(actor_hidden=[16]), success_metric="success", num_tasks=collector.num_tasks())
    cfg = FilteredBCConfig(group_size=2, task_sampling=TaskSamplingConfig(by="failures", mix=0.0))
    algo = FilteredBC(cfg, ctx)
    algo.task_sampler.fail[:] = 0.0
    algo.task_sampler.fail[[3, 11]] = 1.0  # only tasks 3 and 11 fail: with mix 0 the draw is theirs alone
    starts = algo.rollout_starts()
    assert starts.restore is None and set(starts.tasks.tolist()) <= {3, 11}
    assert torch.equal(starts.tasks[0::2], starts.tasks[1::2])  # a group shares its task, as its seed
    collector.reset_seeded(*starts)
    assert torch.equal(env.task_id, starts.tasks)
    q = env.sim.qpos
    assert all(torch.equal(q[i], q[i + 1]) for i in range(0, 8, 2))
    again = FilteredBC(cfg, ctx)  # a resumed run draws what the first would have drawn next
    again.load_rollout_state(algo.rollout_state())
    assert torch.equal(again.task_sampler.fail, algo.task_sampler.fail)
    assert torch.equal(again.rollout_starts().tasks, algo.rollout_starts().tasks)


def test_the_cli_trains_with_task_sampling_and_rejects_a_single_task(minilm, tmp_path, capsys):
    from embodied.cli import main

    run = tmp_path / "run"
    main(["train", "--task", "mini-libero", "--run-dir", str(run), "algo=filtered-bc", "num_envs=8",
          "env.episode_steps=20", "total_steps=480", "filtered-bc.grad_steps=1",
          "filtered-bc.task_sampling.by=failures", "policy.actor_hidden=[16]", "log.eval_every=0",
          "log.eval_episodes=2", "log.progress=false", "log.checkpoint_every=0"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    shares = [r["task_sampling/max_share"] for r in rows if "task_sampling/max_share" in r]
    # an untrained policy fails every task: the draw stays uniform over the 13
    assert len(shares) >= 1 and all(abs(s - 1 / 13) < 1e-9 for s in shares)
    capsys.readouterr()
    code = main(["train", "--task", "point-reach", "--run-dir", str(tmp_path / "bad"), "algo=grpo", "num_envs=8",
                 "grpo.task_sampling.by=failures", "log.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "suite of tasks" in err[0]
    assert not (tmp_path / "bad").exists()
