"""Demonstration starts: tasks restore recorded env states exactly, collect-demos records them, the curriculum's
window, and an episodic learner starting groups from them through the runner's collector."""

from __future__ import annotations

import pytest
import torch

import embodied
from embodied.core.errors import UserError


def _step_both(a, b, pairs, steps, generator):
    """Step envs ``a`` and ``b`` with the same actions on the paired envs ``(i in a, j in b)``; the largest difference
    of their observations and rewards over ``steps`` steps."""
    worst = 0.0
    for _ in range(steps):
        act_a = torch.rand(a.num_envs, 7, generator=generator) * 2 - 1
        act_b = torch.zeros(b.num_envs, 7)
        for i, j in pairs:
            act_b[j] = act_a[i]
        oa, ra, *_ = a.step(act_a)
        ob, rb, *_ = b.step(act_b)
        for i, j in pairs:
            worst = max(worst, *((oa[k][i] - ob[k][j]).abs().max().item() for k in oa), abs(float(ra[i] - rb[j])))
    return worst


@pytest.mark.parametrize("task", ["mini-libero", "pick-place"])
def test_a_restored_env_continues_exactly(task, minilm):
    a = embodied.make_env(task, num_envs=4, seed=0)
    b = embodied.make_env(task, num_envs=4, seed=1)
    a.reset(seed=0)
    b.reset(seed=5)
    g = torch.Generator().manual_seed(0)
    _step_both(a, b, [], 25, g)  # somewhere part-way through an episode, the cube perhaps moved
    rows = a.env_states()
    assert rows.dtype == torch.float64 and rows.shape[0] == 4
    obs = b.restore_envs(torch.tensor([2, 0]), rows[[1, 3]])  # unsorted ids
    now = a._observe()
    for k in now:
        assert torch.equal(obs[k][2], now[k][1]) and torch.equal(obs[k][0], now[k][3])
    assert b.episode_length[2] == 0 and b.episode_length[0] == 0
    assert _step_both(a, b, [(1, 2), (3, 0)], 30, g) == 0.0  # bit for bit, rewards included


def test_restoring_needs_a_task_that_can_and_a_state_of_its_size(minilm):
    env = embodied.make_env("pendulum", num_envs=2, seed=0)
    assert env.env_states() is None
    with pytest.raises(UserError, match="cannot restore"):
        env.restore_envs(torch.tensor([0]), torch.zeros(1, 3, dtype=torch.float64))
    pick = embodied.make_env("pick-place", num_envs=2, seed=0)
    with pytest.raises(UserError, match="recorded state has 5 entries"):
        pick.restore_envs(torch.tensor([0]), torch.zeros(1, 5, dtype=torch.float64))


@pytest.fixture(scope="module")
def demos(tmp_path_factory, minilm):
    from embodied.datasets import collect_demos

    embodied.make_env("mini-libero", num_envs=1).close()  # registers the suite's tasks
    path = tmp_path_factory.mktemp("demo_starts") / "demos"
    collect_demos("mini-libero", 4, path, num_envs=4, seed=0)
    return path


def test_collect_demos_records_each_steps_state(demos):
    from embodied.datasets import read_env_states, read_transitions

    states = read_env_states(demos)
    steps = read_transitions(demos, ["policy"])
    assert states["state"].shape[0] == steps["state"].shape[0]  # one row per step, each episode's end excluded
    assert torch.equal(states["step"] == 0, steps["initial"])
    assert torch.isfinite(states["state"]).all()
    # a recorded row gives back the recorded observation, exactly
    env = embodied.make_env("mini-libero", num_envs=3, seed=7)
    pick = torch.tensor([0, 5, int(states["state"].shape[0]) - 1])
    obs = env.restore_envs(torch.arange(3), states["state"][pick])
    assert torch.equal(obs["policy"], steps["state"][pick])


def test_a_dataset_without_states_is_one_line(tmp_path):
    from embodied.datasets import collect_demos, read_env_states

    collect_demos("point-reach", 2, tmp_path / "d", num_envs=2, seed=0)  # a task that cannot restore states
    with pytest.raises(UserError, match="records no env states"):
        read_env_states(tmp_path / "d")


def test_the_window_and_its_growth(demos):
    from embodied.algos.demo_starts import DemoStarts, DemoStartsConfig

    ds = DemoStarts(DemoStartsConfig(fraction=0.5, reach_step=0.25, advance_at=0.5), str(demos), seed=0)
    # two demonstrations of 10 and 4 steps, by hand
    ds.step = torch.tensor([*range(10), *range(4)])
    ds.length = torch.tensor([10] * 10 + [4] * 4)
    ds.state = torch.arange(14.0)[:, None]
    # reach 0.25: steps >= floor(0.75 * 10) = 7 and >= floor(0.75 * 4) = 3
    assert ds.eligible().nonzero().squeeze(-1).tolist() == [7, 8, 9, 13]
    assert set(ds.sample(200)[:, 0].tolist()) == {7.0, 8.0, 9.0, 13.0}
    log = ds.update(torch.tensor([1.0, 0.0, 0.0]))  # 1/3 < 0.5: stays
    assert log == {"demo_starts/reach": 0.25, "demo_starts/success": pytest.approx(1 / 3)} and ds.reach == 0.25
    ds.update(torch.tensor([1.0, 0.0]))  # 0.5: grows to 0.5, steps >= 5 and >= 2
    assert ds.reach == 0.5 and ds.eligible().nonzero().squeeze(-1).tolist() == [5, 6, 7, 8, 9, 12, 13]
    ds.update(torch.tensor([]))  # no episode from a demonstration state: stays
    for _ in range(5):
        ds.update(torch.ones(2))
    assert ds.reach == 1.0 and bool(ds.eligible().all())  # every step, the first states included
    again = DemoStarts(DemoStartsConfig(fraction=0.5), str(demos), seed=3)
    again.load_state_dict(ds.state_dict())
    assert again.reach == 1.0 and torch.equal(again.generator.get_state(), ds.generator.get_state())


def test_filtered_bc_starts_its_last_groups_from_recorded_states(demos, tmp_path):
    from embodied.algos.base import BuildContext
    from embodied.algos.demo_starts import DemoStartsConfig
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.config import PolicyConfig
    from embodied.datasets import read_env_states, read_transitions
    from embodied.runtime.sync import SyncCollector

    env = embodied.make_env("mini-libero", num_envs=8, seed=0)
    ctx = BuildContext(env.single_observation_space, env.single_action_space, 8, torch.device("cpu"), 0, 1000,
                       PolicyConfig(actor_hidden=[16]), success_metric="success", data=str(demos))
    algo = FilteredBC(FilteredBCConfig(group_size=2, demo_starts=DemoStartsConfig(fraction=0.5)), ctx)
    seeds, (ids, rows), tasks = algo.rollout_starts()
    assert tasks is None
    assert ids.tolist() == [4, 5, 6, 7] and torch.equal(rows[0], rows[1]) and torch.equal(rows[2], rows[3])
    assert algo.from_demo.tolist() == [False] * 4 + [True] * 4
    collector = SyncCollector(lambda n, seed: env, 8, 0, "cpu")
    collector.reset_seeded(seeds, (ids, rows))
    states, steps = read_env_states(demos), read_transitions(demos, ["policy"])
    for i, row in zip(ids.tolist(), rows):
        at = int((states["state"] == row).all(1).nonzero()[0])
        assert torch.equal(collector.obs["policy"][i], steps["state"][at])
        # drawn from the window: the demonstration's last tenth
        assert states["step"][at] >= int(0.9 * states["length"][at])
    with pytest.raises(UserError, match="give data=PATH"):
        FilteredBC(FilteredBCConfig(demo_starts=DemoStartsConfig(fraction=0.5)),
                   BuildContext(env.single_observation_space, env.single_action_space, 8, torch.device("cpu"), 0,
                                1000, PolicyConfig(actor_hidden=[16]), success_metric="success"))


@pytest.mark.parametrize("algo", ["filtered-bc", "grpo"])
def test_the_cli_runs_from_demonstration_starts(algo, demos, tmp_path):
    from embodied.cli import main

    run = tmp_path / "run"
    learner = ["filtered-bc.grad_steps=2"] if algo == "filtered-bc" else ["grpo.num_epochs=1", "grpo.batch_groups=1"]
    main(["train", "--task", "mini-libero", "--run-dir", str(run), f"algo={algo}", f"data={demos}",
          "num_envs=8", "total_steps=1500", f"{algo}.group_size=2", f"{algo}.demo_starts.fraction=0.5", *learner,
          "policy.actor_hidden=[16]", "log.eval_every=0", "log.eval_episodes=2", "log.progress=false",
          "log.checkpoint_every=0"])
    import json

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    reach = [r["demo_starts/reach"] for r in rows if "demo_starts/reach" in r]
    assert reach and all(0.1 <= a <= b <= 1.0 for a, b in zip(reach, reach[1:] + [1.0]))
    assert all("demo_starts/success" in r for r in rows if "demo_starts/reach" in r)
