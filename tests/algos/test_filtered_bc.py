"""Filtered BC: only successful episodes join the pool (contiguous, exact), the pool's ring and sampling, resume, user
errors, and learning."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import embodied
from embodied.config import load_config
from embodied.train import train
from tests.floors import FLOORS


def _ctx(num_envs=4, data=""):
    from embodied.algos.base import BuildContext
    from embodied.config import PolicyConfig

    env = embodied.make_env("point-reach", num_envs=num_envs, seed=0)
    return BuildContext(env.single_observation_space, env.single_action_space, num_envs, torch.device("cpu"), 0, 1000,
                        PolicyConfig(actor_hidden=[16]), success_metric="success", data=data)


def _fbc(**overrides):
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig

    return FilteredBC(FilteredBCConfig(**overrides), _ctx())


def _rollout(algo, ends, outcomes, length=4):
    """One episodic rollout: env i's observation at step t is ``[i, t, 0, 0]``, its first episode ends at step
    ``ends[i]`` with ``outcomes[i]``; later steps of an env belong to its next episode (not recorded)."""
    from embodied.algos.base import Transition

    algo.rollout_starts()
    for t in range(length):
        obs = {"policy": torch.tensor([[i, t, 0.0, 0.0] for i in range(4)])}
        action, extras = algo.act(obs)
        done = torch.tensor([t == e for e in ends])
        algo.observe(Transition(obs, action, torch.zeros(4), done, torch.zeros(4, dtype=torch.bool), obs, extras,
                                outcome={"success": torch.tensor(outcomes, dtype=torch.float32)}))
    return algo.update()


def test_only_successful_episodes_join_the_pool_each_one_contiguous():
    algo = _fbc(grad_steps=0)
    out = _rollout(algo, ends=[1, 3, 2, 0], outcomes=[1, 0, 1, 1])
    # env 0: steps 0-1, env 2: steps 0-2, env 3: step 0 (env 1 failed); env-major order
    ring = algo.pool.ring
    assert algo.pool.size == 6 and algo.pool.filled == 6 and algo.pool.added == 6
    assert torch.equal(ring["obs"][:6, :2], torch.tensor([[0, 0], [0, 1], [2, 0], [2, 1], [2, 2], [3, 0.0]]))
    assert out["filtered-bc/won_episodes"] == 3 and out["filtered-bc/rollout_success"] == 0.75
    assert "filtered-bc/loss" not in out  # no gradient steps asked for
    _rollout(algo, ends=[3, 3, 3, 0], outcomes=[0, 0, 0, 1])  # one step of env 3 (its index beyond the rows added)
    assert algo.pool.size == 7 and torch.equal(algo.pool.ring["obs"][6, :2], torch.tensor([3, 0.0]))


def test_the_pool_keeps_the_newest_steps_and_samples_both_sources(tmp_path):
    from embodied.algos.cotrain import DemoLoss
    from embodied.policies import GaussianActor

    pi = GaussianActor(4, 2, [8])
    pool = DemoLoss.empty(pi, 4, torch.device("cpu"), 64, capacity=5)
    obs = torch.arange(7.0)[:, None].expand(7, 4)
    pool.extend({"obs": obs[:3]}, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long))
    pool.extend({"obs": obs[3:]}, torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))  # 7 added, 5 kept
    assert pool.size == 5 and pool.added == 7
    assert sorted(pool.ring["obs"][:, 0].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]  # the two oldest overwritten
    seen, _ = pool.sample(torch.Generator().manual_seed(0))
    assert set(seen[:, 0].tolist()) <= {2.0, 3.0, 4.0, 5.0, 6.0}
    again = DemoLoss.empty(pi, 4, torch.device("cpu"), 64, capacity=5)
    again.load_state_dict(pool.state_dict())
    assert again.size == 5 and again.added == 7 and torch.equal(again.ring["obs"], pool.ring["obs"])


def test_a_balanced_pool_gives_every_group_the_same_share():
    from embodied.algos.cotrain import DemoLoss
    from embodied.policies import GaussianActor

    pi = GaussianActor(4, 2, [8])
    pool = DemoLoss.empty(pi, 4, torch.device("cpu"), 4000, capacity=100, balance=True)
    obs = torch.arange(100.0)[:, None].expand(100, 4)
    group = torch.tensor([0] * 90 + [3] * 10)  # group 3: 10 of 100 steps; groups 1-2 absent
    with pytest.raises(ValueError, match="group"):
        pool.extend({"obs": obs}, torch.zeros(100, 2), torch.zeros(100, dtype=torch.long))
    pool.extend({"obs": obs}, torch.zeros(100, 2), torch.zeros(100, dtype=torch.long), group)
    w = pool.ring_weights()
    assert torch.equal(w, torch.tensor([1 / 180] * 90 + [1 / 20] * 10, dtype=torch.float64))  # 1 / (2 groups x rows)
    seen, _ = pool.sample(torch.Generator().manual_seed(0))
    share = float((seen[:, 0] >= 90).double().mean())
    assert abs(share - 0.5) < 0.03  # 4000 draws: std 0.008
    assert set(seen[seen[:, 0] >= 90, 0].tolist()) == set(range(90, 100))  # every row of the small group drawn
    # the pool's own filled-uniform weights without balance; resumed, the groups and the weights come back
    empty = DemoLoss.empty(pi, 4, torch.device("cpu"), 8, capacity=4)
    assert torch.equal(empty.ring_weights(), torch.zeros(0, dtype=torch.float64))
    again = DemoLoss.empty(pi, 4, torch.device("cpu"), 4000, capacity=100, balance=True)
    again.load_state_dict(pool.state_dict())
    assert torch.equal(again.ring_weights(), w)


def test_a_discounted_pool_draws_each_success_by_its_discounted_return(tmp_path):
    from embodied.algos.cotrain import DemoLoss
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.policies import GaussianActor

    algo = _fbc(grad_steps=0, discount=0.5)
    _rollout(algo, ends=[1, 3, 2, 0], outcomes=[1, 0, 1, 1])
    # env 0 won in 2 steps, env 2 in 3, env 3 in 1 (env 1 failed): each step weighs 0.5 ** its episode's length
    raw = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.125, 0.5], dtype=torch.float64)
    assert torch.equal(algo.pool.ring["weight"][:6], raw)
    assert torch.equal(algo.pool.ring_weights(), raw / 1.375)
    algo.pool.batch_size = 20000
    seen, _ = algo.pool.sample(torch.Generator().manual_seed(0))
    share = torch.stack([(seen[:, :2] == torch.tensor(r)).all(1).double().mean()
                         for r in ([0, 0.0], [0, 1.0], [2, 0.0], [2, 1.0], [2, 2.0], [3, 0.0])])
    assert torch.allclose(share, raw / 1.375, atol=0.01)  # 20000 draws: std <= 0.0035
    again = FilteredBC(FilteredBCConfig(grad_steps=0, discount=0.5), _ctx())  # resumed: the weights come back
    again.load_state_dict(algo.state_dict())
    assert torch.equal(again.pool.ring_weights(), algo.pool.ring_weights())
    # discount 1: every success alike, as the plain pool draws them
    flat = _fbc(grad_steps=0, discount=1.0)
    _rollout(flat, ends=[1, 3, 2, 0], outcomes=[1, 0, 1, 1])
    assert torch.equal(flat.pool.ring_weights(), torch.full((6,), 1 / 6, dtype=torch.float64))
    # with balance: a row's weight over its group's total, over the groups present
    pi = GaussianActor(4, 2, [8])
    both = DemoLoss.empty(pi, 4, torch.device("cpu"), 8, capacity=10, balance=True, weighted=True)
    with pytest.raises(ValueError, match="weight"):
        both.extend({"obs": torch.zeros(3, 4)}, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long),
                    torch.tensor([0, 0, 1]))
    both.extend({"obs": torch.zeros(3, 4)}, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long),
                torch.tensor([0, 0, 1]), torch.tensor([1.0, 3.0, 2.0]))
    assert torch.equal(both.ring_weights(), torch.tensor([0.125, 0.375, 0.5], dtype=torch.float64))


def test_correlated_noise_is_an_ar1_process_through_each_rollout():
    rho = 0.8  # sqrt(1 - rho^2) = 0.6
    algo = _fbc(grad_steps=0, noise_correlation=rho)
    algo.rollout_starts()
    obs = {"policy": torch.tensor([[i, 0.5, -0.5, 0.0] for i in range(4)])}
    dist = algo.dist(obs["policy"])
    g = torch.Generator()
    g.set_state(algo.generator.get_state())  # the draws the rollouts will take
    noise = None
    for _ in range(3):
        action, extras = algo.act(obs)
        fresh = torch.randn(dist.mean.shape, generator=g)
        noise = fresh if noise is None else rho * noise + 0.6 * fresh
        assert torch.allclose(action, dist.mean + dist.stddev * noise, atol=1e-6)
        assert torch.allclose(extras["log_prob"], dist.log_prob(action))
    algo.rollout_starts()  # a new rollout draws its noise afresh
    assert algo.noise is None
    # its statistics: standard normal at every step, lag-1 correlation rho (4 x 2 dims x 4000 steps)
    steps = []
    for _ in range(4000):
        algo.act(obs)
        steps.append(algo.noise)
    e = torch.stack(steps)
    assert abs(float(e.var()) - 1.0) < 0.08
    assert abs(float((e[1:] * e[:-1]).mean() / e.var()) - rho) < 0.03
    # rho 0 (the default): the white noise of every rollout learner, from the same generator
    white = _fbc(grad_steps=0)
    white.rollout_starts()
    g.set_state(white.generator.get_state())
    action, _ = white.act(obs)
    assert torch.allclose(action, dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=g), atol=1e-6)
    assert white.noise is None


def test_filtered_bc_balances_its_pool_by_the_episodes_tasks():
    from embodied.algos.base import Transition
    from embodied.core.errors import UserError

    algo = _fbc(grad_steps=0, balance="task")
    algo.rollout_starts()
    for t in range(3):  # envs 0-2 succeed at steps 0 / 1 / 2, their tasks 5 / 5 / 2; env 3 never ends
        obs = {"policy": torch.tensor([[i, t, 0.0, 0.0] for i in range(4)])}
        action, extras = algo.act(obs)
        done = torch.tensor([t == e for e in (0, 1, 2, 9)])
        algo.observe(Transition(obs, action, torch.zeros(4), done, torch.zeros(4, dtype=torch.bool), obs, extras,
                                outcome={"success": torch.ones(4), "task_id": torch.tensor([5.0, 5, 2, 7])}))
    algo.update()
    assert algo.pool.ring["group"][:6].tolist() == [5, 5, 5, 2, 2, 2]  # env-major: env 0's step, env 1's two, env 2's
    assert torch.allclose(algo.pool.ring_weights(), torch.full((6,), 1 / 6, dtype=torch.float64))
    unlabelled = _fbc(grad_steps=0, balance="task")  # a task that reports no task of a suite: one clear error
    with pytest.raises(UserError, match="balance=pool"):
        _rollout(unlabelled, ends=[0, 0, 0, 0], outcomes=[1, 1, 1, 1])


def test_demonstrations_stay_in_the_pool_beside_the_rollouts(tmp_path):
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.cli import main

    demos = tmp_path / "demos"
    assert main(["collect-demos", "--task", "point-reach", "--episodes", "4", "--out", str(demos)]) == 0
    algo = FilteredBC(FilteredBCConfig(grad_steps=1, batch_size=4096), _ctx(data=str(demos)))
    n_demo = algo.pool.size
    assert n_demo > 0 and algo.pool.filled == 0
    _rollout(algo, ends=[1, 3, 2, 0], outcomes=[1, 0, 0, 0])
    assert algo.pool.size == n_demo + 2
    obs, _ = algo.pool.sample(torch.Generator().manual_seed(0))
    rollout_rows = (obs[:, 1] <= 1) & (obs[:, 0] == 0) & (obs[:, 2:] == 0).all(1)  # env 0's [0, t, 0, 0] steps
    assert 0 < int(rollout_rows.sum()) < 4096  # both sources drawn
    # demo_ratio: exactly that share of every minibatch from the demonstrations, the rest from the added steps
    fixed = FilteredBC(FilteredBCConfig(grad_steps=1, batch_size=40, demo_ratio=0.25), _ctx(data=str(demos)))
    assert fixed.pool.demo_ratio == 0.25
    _rollout(fixed, ends=[1, 3, 2, 0], outcomes=[1, 0, 0, 0])
    obs, _ = fixed.pool.sample(torch.Generator().manual_seed(0))
    rollout_rows = (obs[:, 1] <= 1) & (obs[:, 0] == 0) & (obs[:, 2:] == 0).all(1)
    assert rollout_rows.tolist() == [False] * 10 + [True] * 30  # 10 of 40 demonstration rows, then 30 added ones


def test_bad_settings_are_one_clear_error(tmp_path):
    from embodied.core.errors import UserError

    with pytest.raises(UserError, match="success"):
        train(load_config("target", None, ["algo=filtered-bc", "num_envs=8"]), tmp_path / "a")
    with pytest.raises(UserError, match="balance"):
        train(load_config("point-reach", None, ["algo=filtered-bc", "num_envs=8", "filtered-bc.balance=tasks"]),
              tmp_path / "c")
    with pytest.raises(UserError, match="grad_steps"):
        train(load_config("point-reach", None, ["algo=filtered-bc", "num_envs=8", "filtered-bc.grad_steps=-1"]),
              tmp_path / "b")
    with pytest.raises(UserError, match="noise_correlation"):
        train(load_config("point-reach", None, ["algo=filtered-bc", "num_envs=8", "filtered-bc.noise_correlation=1"]),
              tmp_path / "e")
    with pytest.raises(UserError, match="discount"):
        train(load_config("point-reach", None, ["algo=filtered-bc", "num_envs=8", "filtered-bc.discount=1.5"]),
              tmp_path / "d")


def test_filtered_bc_learns_point_reach_and_checkpoints_its_pool(tmp_path):
    cfg = load_config("point-reach", None, ["algo=filtered-bc", "num_envs=64", "total_steps=30000", "log.eval_every=0",
                                            "log.eval_episodes=128", "log.progress=false", "log.tensorboard=false",
                                            "policy.actor_hidden=[64,64]", "filtered-bc.lr=1e-3",
                                            "log.checkpoint_every=10000"])
    run_dir, summary = train(cfg, tmp_path / "run")
    assert summary["eval/success"] >= FLOORS["filtered_bc_point_reach_success"]
    from embodied.checkpoint import load_checkpoint

    state = load_checkpoint(run_dir)
    assert state["algo"]["pool"]["filled"] > 0  # the pool is in the checkpoint


def test_the_pool_clones_with_bcs_noise_and_grounding(mini_libero_demos):
    """``filtered-bc.ground`` / ``obs_noise``: the pool's loss is BC's, exactly: the cloning loss on noisy states plus
    the pointers' grounding cross-entropy, its labels read off each episode, the dataset's and each added one; with
    ``fit_temperature`` the cloning loss is the likelihood at the rollouts' temperature."""
    from embodied.algos.bc import episode_grounding, grounding_loss, state_noise_scale
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig

    env, ctx, data = mini_libero_demos.env, mini_libero_demos.ctx, mini_libero_demos.data
    algo = FilteredBC(FilteredBCConfig(ground=1.0, obs_noise=0.05), ctx)
    pool, pi = algo.pool, algo.pi
    episode = torch.cumsum(data["initial"].long(), 0) - 1
    labels = episode_grounding(pi, data["state"], episode)
    assert torch.equal(pool.data["ground"], labels)
    assert (labels[:, 0] >= 0).all()  # the expert moved a cube in every episode
    assert torch.equal(pool.noise_scale, state_noise_scale(data["state"], env.layout(), 0.05))
    first = episode == 0  # the first episode again, as a rollout's
    pool.extend({"obs": data["state"][first]}, data["action"][first], torch.zeros(int(first.sum()), dtype=torch.long))
    assert torch.equal(pool.ring["ground"][:int(first.sum())], labels[first])
    g = torch.Generator().manual_seed(3)
    loss = pool(pi, g)
    g.manual_seed(3)
    rows = pool._draw(g)
    obs = rows["obs"] + torch.randn(rows["obs"].shape, generator=g) * pool.noise_scale
    expected = pi.bc_loss(obs, rows["target"]) + grounding_loss(pi, obs, rows["ground"])[0]
    assert torch.allclose(loss, expected)
    # fit_temperature: the same loss with the likelihood of the policy the rollouts sample (at the temperature)
    tempered = FilteredBC(FilteredBCConfig(ground=1.0, obs_noise=0.05, temperature=0.5, fit_temperature=True), ctx)
    tempered.generator.manual_seed(3)
    loss = tempered._loss(tempered.pi)
    g.manual_seed(3)
    rows = tempered.pool._draw(g)
    obs = rows["obs"] + torch.randn(rows["obs"].shape, generator=g) * tempered.pool.noise_scale
    expected = tempered.pi.bc_loss(obs, rows["target"], std_temperature=0.5) + \
        grounding_loss(tempered.pi, obs, rows["ground"])[0]
    assert torch.allclose(loss, expected)
    assert not torch.allclose(loss, tempered.pi.bc_loss(obs, rows["target"]) +
                              grounding_loss(tempered.pi, obs, rows["ground"])[0])


def _adam_steps(opt) -> int:
    return max(int(s["step"]) for s in opt.state_dict()["state"].values())


def test_members_act_as_their_mean_and_each_clones_the_shared_pool():
    """``filtered-bc.members=2``: the rollouts sample a Gaussian around the members' mean action with their mean scale
    (times the temperature), the run's policy is their action mean, every member takes its own gradient steps on the
    one pool, and both members and their optimizers round-trip through the state."""
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.core.errors import UserError
    from embodied.policies import EnsembleActor

    algo = _fbc(members=2, grad_steps=3, temperature=0.5)
    a, b = algo.members
    assert a is algo.pi and a is not b
    with torch.no_grad():  # away from the zero-initialized last layers and the shared initial scale
        for m, shift in ((a, 0.3), (b, -0.2)):
            for p in m.parameters():
                p.add_(shift * torch.randn_like(p))
    obs = torch.randn(6, 4)
    with torch.no_grad():
        d, da, db = algo.dist(obs), a.dist(obs), b.dist(obs)
        assert torch.allclose(d.mean, (da.mean + db.mean) / 2)
        assert torch.allclose(d.stddev, (da.stddev + db.stddev) / 2 * 0.5)
    policy = algo.actor()
    assert isinstance(policy, EnsembleActor) and list(policy.members) == [a, b]
    assert torch.allclose(policy.act(obs), (a.act(obs) + b.act(obs)) / 2)
    before = [[p.clone() for p in m.parameters()] for m in (a, b)]
    out = _rollout(algo, ends=[1, 3, 2, 0], outcomes=[1, 0, 1, 1])
    assert algo.pool.size == 6 and out["filtered-bc/loss"] > 0
    assert out["filtered-bc/log_std"] == pytest.approx(float((a.log_std.mean() + b.log_std.mean()) / 2))
    for m, old in zip((a, b), before):
        assert any(not torch.equal(p, q) for p, q in zip(m.parameters(), old))
    assert [_adam_steps(o) for o in algo.opts] == [3, 3]
    twin = FilteredBC(FilteredBCConfig(members=2, grad_steps=3, temperature=0.5), _ctx())
    twin.load_state_dict(algo.state_dict())
    for m, t in zip(algo.members, twin.members):
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), t.parameters()))
    assert [_adam_steps(o) for o in twin.opts] == [3, 3]
    with pytest.raises(UserError, match="members"):
        FilteredBC.build(FilteredBCConfig(members=0), _ctx())


def test_rollout_steps_are_grounded_with_their_instructed_entities(minilm):
    """``filtered-bc.ground_rollouts``: every finished first episode's steps, failed ones too, join a ring labelled
    with the entities the task says the episode was instructed about (the outcome's INSTRUCTED), env-major; each
    gradient step adds the weighted grounding loss on a minibatch of it (exact); the ring is checkpointed; one clear
    line for a policy without pointers and for a task that reports no instructed entities."""
    from embodied.algos.base import BuildContext, Transition
    from embodied.algos.bc import grounding_loss
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.config import PolicyConfig, VLAConfig
    from embodied.core.base import INSTRUCTED
    from embodied.core.errors import UserError

    env = embodied.make_env("mini-libero", num_envs=4, seed=0)
    ctx = BuildContext(env.single_observation_space, env.single_action_space, 4, torch.device("cpu"), 0, 1000,
                       PolicyConfig(arch="vla", vla=VLAConfig(state_encoder="pointers", head="continuous")),
                       layout=env.layout(), success_metric="success")
    base, _ = env.reset(seed=0)
    env.close()
    told = torch.tensor([[0, 4], [1, 2], [3, 5], [2, -1]], dtype=torch.float32)

    def rollout(algo, outcome_keys=INSTRUCTED):
        algo.rollout_starts()
        for t in range(3):  # envs 0-2 end their first episodes at steps 1 / 2 / 0 (env 1 succeeds); env 3 never
            obs = {"policy": base["policy"] + t}
            action, extras = algo.act(obs)
            done = torch.tensor([t == e for e in (1, 2, 0, 9)])
            outcome = {"success": torch.tensor([0.0, 1, 0, 0]), **{k: told[:, j] for j, k in enumerate(outcome_keys)}}
            algo.observe(Transition(obs, action, torch.zeros(4), done, torch.zeros(4, dtype=torch.bool), obs, extras,
                                    outcome=outcome))
        return algo.update()

    algo = FilteredBC(FilteredBCConfig(ground_rollouts=0.5, grad_steps=0), ctx)
    rollout(algo)
    ring = algo.told.ring
    assert algo.told.filled == 6 and algo.pool.filled == 3  # the grounding ring keeps the failures too
    assert ring["labels"][:6].tolist() == [[0, 4], [0, 4], [1, 2], [1, 2], [1, 2], [3, 5]]
    step = (ring["obs"][:6] - base["policy"][[0, 0, 1, 1, 1, 2]])[:, 0]
    assert torch.allclose(step, torch.tensor([0.0, 1, 0, 1, 2, 0]))
    algo.generator.manual_seed(3)
    loss = algo._loss(algo.pi)
    g = torch.Generator().manual_seed(3)
    expected = algo.pool(algo.pi, g)
    obs, labels = algo.told.sample(algo.cfg.batch_size, g)
    expected = expected + 0.5 * grounding_loss(algo.pi, obs, labels)[0]
    assert torch.allclose(loss, expected)
    again = FilteredBC(FilteredBCConfig(ground_rollouts=0.5, grad_steps=0), ctx)
    again.load_state_dict(algo.state_dict())
    assert again.told.filled == 6 and torch.equal(again.told.ring["labels"][:6], ring["labels"][:6])
    with pytest.raises(UserError, match="entity pointers"):
        _fbc(ground_rollouts=1.0)
    with pytest.raises(UserError, match="reports none"):
        rollout(FilteredBC(FilteredBCConfig(ground_rollouts=0.5, grad_steps=0), ctx), outcome_keys=())


def test_the_run_ships_a_polyak_average_of_each_member(tmp_path):
    """``filtered-bc.average_tau``: after every gradient step each member's averaged copy moves that fraction toward
    it (exact over a step), the run's policy is the averages' ensemble while the rollouts sample around the trained
    members, ``init=`` weights reach the members through the averages, the averages round-trip through the state;
    a rate outside (0, 1] is one clear line."""
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.core.errors import UserError
    from embodied.policies import EnsembleActor

    algo = _fbc(members=2, grad_steps=1, average_tau=0.25)
    a, b = algo.members
    with torch.no_grad():
        for m, shift in ((a, 0.3), (b, -0.2)):
            for p in m.parameters():
                p.add_(shift * torch.randn_like(p))
    algo.actor_loaded()  # as after init=: the members start from the averages (here the untouched copies)
    assert all(torch.equal(p, q) for m, c in zip(algo.members, algo.averages)
               for p, q in zip(m.parameters(), c.parameters()))
    with torch.no_grad():  # the averages apart from the members: a trained policy and its average differ
        for c in algo.averages:
            for p in c.parameters():
                p.add_(0.1 * torch.randn_like(p))
    start = [[p.clone() for p in m.parameters()] for m in algo.averages]
    _rollout(algo, ends=[1, 3, 2, 0], outcomes=[1, 0, 1, 1])
    for c, m, old in zip(algo.averages, algo.members, start):
        for p, w, o in zip(c.parameters(), m.parameters(), old):
            assert torch.allclose(p, o + 0.25 * (w - o), atol=1e-7)
    policy = algo.actor()
    assert isinstance(policy, EnsembleActor) and list(policy.members) == algo.averages
    obs = torch.randn(6, 4)
    with torch.no_grad():
        assert torch.allclose(algo.dist(obs).mean, (a.dist(obs).mean + b.dist(obs).mean) / 2)  # the trained ones
        assert not torch.allclose(policy.act(obs), (a.act(obs) + b.act(obs)) / 2)
    twin = FilteredBC(FilteredBCConfig(members=2, grad_steps=1, average_tau=0.25), _ctx())
    twin.load_state_dict(algo.state_dict())
    assert all(torch.equal(p, q) for x, y in zip(algo.averages, twin.averages)
               for p, q in zip(x.parameters(), y.parameters()))
    for bad in (0.0, 1.5):
        with pytest.raises(UserError, match="average_tau"):
            FilteredBC.build(FilteredBCConfig(average_tau=bad), _ctx())


def test_the_run_ships_the_policy_its_rollouts_sample(tmp_path):
    """``filtered-bc.sampled_policy``: the run's policy samples the rollouts' own distribution (the members' mean of
    means and of scales, at the temperature): exactly mean + stddev x its generator's standard normals, the same draws
    again after ``reset(None)``, given noise exactly; it rebuilds from its spec; ``init=`` moves weights between it
    and a policy that takes its mean, either way; a token head is one clear line (and for ``fit_temperature``, so is
    a policy without a Gaussian cloning loss)."""
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.checkpoint import save_checkpoint
    from embodied.config import PolicyConfig
    from embodied.core.errors import UserError
    from embodied.policies import SampledActor, build_policy, policy_spec
    from embodied.train import warm_start

    algo = _fbc(members=2, temperature=0.5, sampled_policy=True)
    with torch.no_grad():
        for m, shift in zip(algo.members, (0.3, -0.2)):
            for p in m.parameters():
                p.add_(shift * torch.randn_like(p))
    policy = algo.actor()
    assert isinstance(policy, SampledActor) and policy.actor is algo.ensemble
    obs = torch.randn(6, 4)
    with torch.no_grad():
        d = algo.dist(obs)  # what the rollouts sample
        policy.reset(None)
        first, second = policy.act(obs), policy.act(obs)
        g = torch.Generator().manual_seed(0)  # the run's seed
        for got in (first, second):
            assert torch.allclose(got, d.mean + d.stddev * torch.randn(d.mean.shape, generator=g))
        policy.reset(None)
        assert torch.equal(policy.act(obs), first)
        noise = torch.randn(6, 2)
        assert torch.allclose(policy(obs, noise), d.mean + d.stddev * noise)
        rebuilt = build_policy(policy_spec(policy))
        rebuilt.load_state_dict(policy.state_dict())
        rebuilt.reset(None)
        assert torch.equal(rebuilt.act(obs), first)
    # init=: a sampled run's weights into a policy that takes its mean, and back
    def ckpt(spec, state):
        return {"format": 1, "config": {}, "step": 1, "algo": {}, "collector": {},
                "policy": {"spec": spec, "state": state}}

    save_checkpoint(tmp_path / "sampled", 1, ckpt(policy_spec(policy), policy.state_dict()))
    plain = _fbc(members=2, temperature=0.5)
    warm_start(plain.actor(), str(tmp_path / "sampled"))
    assert all(torch.equal(p, q) for x, y in zip(plain.members, algo.members)
               for p, q in zip(x.parameters(), y.parameters()))
    save_checkpoint(tmp_path / "plain", 1, ckpt(policy_spec(algo.ensemble), algo.ensemble.state_dict()))
    again = _fbc(members=2, temperature=0.5, sampled_policy=True)
    warm_start(again.actor(), str(tmp_path / "plain"))
    assert all(torch.equal(p, q) for x, y in zip(again.members, algo.members)
               for p, q in zip(x.parameters(), y.parameters()))
    ctx = dataclasses.replace(_ctx(), policy=PolicyConfig(arch="vla"))
    ctx.policy.vla.head = "tokens"
    with pytest.raises(UserError, match="continuous head"):
        FilteredBC.build(FilteredBCConfig(sampled_policy=True), ctx)
    with pytest.raises(UserError, match="continuous head"):  # a token head's bins have no noise to correlate
        FilteredBC.build(FilteredBCConfig(noise_correlation=0.8), ctx)
    for other in (ctx, _ctx()):  # fit_temperature: a token head, an mlp (its pool loss is the action MSE)
        with pytest.raises(UserError, match="continuous head"):
            FilteredBC.build(FilteredBCConfig(fit_temperature=True), other)
    with pytest.raises(ValueError, match="temperature"):
        SampledActor(algo.pi, 0.0)


def test_relabelled_copies_join_the_pool_and_the_clone(mini_libero_demos, capsys):
    """``filtered-bc.relabel`` / ``bc.relabel``: the relabelled copies of every demonstration, and of every episode
    added, join beside it with the source's action targets, grounding labels read off the copy (the renamed cubes),
    and the copies' episodes numbered on; a task without a relabelling makes none and says so in one line."""
    from embodied.algos.base import BuildContext
    from embodied.algos.bc import BC, BCConfig, episode_grounding
    from embodied.algos.filtered_bc import FilteredBC, FilteredBCConfig
    from embodied.config import PolicyConfig
    from embodied.core.errors import UserError

    ctx, data = mini_libero_demos.ctx, mini_libero_demos.data
    t = len(data["state"])
    algo = FilteredBC(FilteredBCConfig(ground=1.0, relabel=2), ctx)
    pool, pi = algo.pool, algo.pi
    assert pool.target.shape[0] == 3 * t  # every mini-libero task has a renaming
    assert torch.equal(pool.target[t:2 * t], pool.target[:t]) and torch.equal(pool.target[2 * t:], pool.target[:t])
    obs = pool.obs["obs"]
    copies = obs[t:2 * t]
    assert not torch.equal(copies, obs[:t]) and torch.equal(copies[:, :10], obs[:t, :10])  # proprioception kept
    episode = torch.cumsum(data["initial"].long(), 0) - 1
    assert torch.equal(pool.data["ground"][t:2 * t], episode_grounding(pi, copies, episode))
    first = episode == 0
    k = int(first.sum())
    pool.extend({"obs": data["state"][first]}, data["action"][first], torch.zeros(k, dtype=torch.long))
    assert pool.filled == 3 * k and torch.equal(pool.ring["target"][k:2 * k], pool.ring["target"][:k])
    clone = BC(BCConfig(holdout=0.0, relabel=3, ground=1.0), ctx, data)
    assert clone.action.shape[0] == 4 * t and torch.equal(clone.ground[:t], episode_grounding(pi, data["state"],
                                                                                                 episode))
    plain = embodied.make_env("point-reach", num_envs=2, seed=0)
    bare = FilteredBC.build(FilteredBCConfig(relabel=1), BuildContext(
        plain.single_observation_space, plain.single_action_space, 2, torch.device("cpu"), 0, 1000, PolicyConfig(),
        success_metric="success"))
    assert bare.pool.relabel == 0 and "no relabelling" in capsys.readouterr().err  # one line, no copies
    with pytest.raises(UserError, match=">= 0"):
        BC.build(BCConfig(relabel=-1), ctx)
    with pytest.raises(UserError, match=">= 0"):
        FilteredBC.build(FilteredBCConfig(relabel=-1), ctx)
