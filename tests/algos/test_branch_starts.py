"""Branch starts: an episodic learner records every env's state before each step, keeps the steps of the fresh-start
episodes that failed, and starts its next rollout's last groups from them, each group from one exact state."""

from __future__ import annotations

import json

import pytest
import torch

import embodied
from embodied.core.errors import UserError


def test_the_candidates_are_the_steps_of_the_chosen_episodes():
    from embodied.algos.branch_starts import BranchStarts, BranchStartsConfig

    bs = BranchStarts(BranchStartsConfig(fraction=0.5), seed=0)
    for t in range(3):  # 3 steps of 4 envs; row value 10 t + env
        bs.record(torch.tensor([[10.0 * t + e, -1.0] for e in range(4)]))
    valid = torch.ones(3, 4, dtype=torch.bool)
    valid[2, 2] = False  # env 2's episode ended after its second step
    bs.close(valid, torch.tensor([True, False, True, False]))
    assert sorted(bs.candidates[:, 0].tolist()) == [0.0, 2.0, 10.0, 12.0, 20.0]
    assert bs.rows == [] and bs.available() == 5
    assert set(bs.sample(200)[:, 0].tolist()) == {0.0, 2.0, 10.0, 12.0, 20.0}
    again = BranchStarts(BranchStartsConfig(fraction=0.5), seed=9)
    again.load_state_dict(bs.state_dict())
    assert torch.equal(again.sample(7), bs.sample(7))
    bs.record(torch.zeros(4, 2))
    bs.close(torch.ones(1, 4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool))  # nothing failed: none
    assert bs.available() == 0
    with pytest.raises(UserError, match="cannot record"):
        bs.record(None)


def _rollout(algo, collector):
    """One episodic rollout as the on-policy runner plays it: its starts, the update's log, and each step's recorded
    env states ``[N, S]`` with the observations ``[N, D]`` acted on there."""
    starts = algo.rollout_starts()
    collector.reset_seeded(*starts)
    ended = torch.zeros(collector.num_envs, dtype=torch.bool)
    seen = []
    while not bool(ended.all()):
        rows = collector.env_states()
        seen.append((rows, collector.obs["policy"].clone()))
        algo.record_env_states(rows)
        tr = collector.step(algo.act)
        algo.observe(tr)
        ended |= tr.terminated | tr.truncated
    return starts, algo.update(), seen


def test_filtered_bc_starts_groups_from_its_failed_episodes_states(minilm):
    from embodied.algos.base import BuildContext
    from embodied.algos.branch_starts import BranchStartsConfig
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.config import PolicyConfig
    from embodied.runtime.sync import SyncCollector

    env = embodied.make_env("mini-libero", num_envs=8, seed=0, episode_steps=20)
    ctx = BuildContext(env.single_observation_space, env.single_action_space, 8, torch.device("cpu"), 0, 1000,
                       PolicyConfig(actor_hidden=[16]), success_metric="success")
    algo = FilteredBC(FilteredBCConfig(group_size=2, branch_starts=BranchStartsConfig(fraction=0.5)), ctx)
    assert algo.records_env_states
    collector = SyncCollector(lambda n, seed: env, 8, 0, "cpu")
    starts, log, first = _rollout(algo, collector)
    assert starts.restore is None  # nothing recorded yet: every group starts fresh
    assert log["branch_starts/candidates"] == 8 * 20  # every episode failed (an untrained policy, 20 steps)
    starts, log, second = _rollout(algo, collector)
    ids, rows = starts.restore
    assert ids.tolist() == [4, 5, 6, 7] and torch.equal(rows[0], rows[1]) and torch.equal(rows[2], rows[3])
    assert algo.from_branch.tolist() == [False] * 4 + [True] * 4
    assert log["branch_starts/success"] == 0.0 and log["branch_starts/candidates"] == 4 * 20  # fresh ones only
    # each branched env began in a state of the first rollout, exactly, and saw that step's observation again
    states = torch.cat([r for r, _ in first])
    observed = torch.cat([o for _, o in first])
    start_rows, start_obs = second[0]
    for i, row in zip(ids.tolist(), rows):
        assert torch.equal(start_rows[i], row)
        at = (states == row).all(1).nonzero()
        assert at.numel() and torch.equal(start_obs[i], observed[at[0, 0]])


def test_the_cli_trains_with_branch_starts_and_rejects_a_bad_fraction(minilm, tmp_path, capsys):
    from embodied.cli import main

    run = tmp_path / "run"
    main(["train", "--task", "mini-libero", "--run-dir", str(run), "algo=filtered-bc", "num_envs=8",
          "env.episode_steps=20", "total_steps=600", "filtered-bc.group_size=2", "filtered-bc.grad_steps=2",
          "filtered-bc.branch_starts.fraction=0.5", "policy.actor_hidden=[16]", "log.eval_every=0",
          "log.eval_episodes=2", "log.progress=false", "log.checkpoint_every=0"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "branch_starts/candidates" in r][-1]
    assert last["branch_starts/candidates"] == 80.0 and last["branch_starts/success"] == 0.0  # half the groups branch
    capsys.readouterr()
    code = main(["train", "--task", "mini-libero", "--run-dir", str(tmp_path / "bad"), "algo=grpo", "num_envs=8",
                 "grpo.branch_starts.fraction=1.5", "log.progress=false"])
    assert code == 2 and "grpo.branch_starts.fraction must be in [0, 1]" in capsys.readouterr().err
    code = main(["train", "--task", "mini-libero", "--run-dir", str(tmp_path / "bad"), "algo=filtered-bc", "num_envs=8",
                 "filtered-bc.branch_starts.fraction=0.5", "filtered-bc.branch_starts.source=some",
                 "log.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: filtered-bc.branch_starts.source is failed or all, got 'some'"]  # one line
