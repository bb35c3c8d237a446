"""An ensemble of independent learners (``ensemble=K``): the policy is exactly the members' action mean, it rebuilds
from its spec, exports as one program (run by numpy, torch and the C/ONNX bundle with parity), each member sees only
its own slice of the envs and has its own seed, the checkpoint round-trips, and TD3 members learn the target task
above the single learner's floor on the same per-member budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embodied import load_policy
from embodied.algos.ensemble import EnsembleAlgorithm, member_seed
from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.policies import DeterministicActor, EnsembleActor, build_policy, policy_spec
from embodied.policies.export import ProgramModule, fold, program, run_numpy
from embodied.train import build, train

QUIET = ["log.progress=false", "log.tensorboard=false", "log.checkpoint_every=0"]


def _members() -> list[DeterministicActor]:
    torch.manual_seed(0)
    plain = DeterministicActor(5, 3, [16, 16], "relu")
    normalized = DeterministicActor(5, 3, [8], "tanh", obs_normalization=True)
    normalized.normalizer.update(torch.randn(64, 5) * 3 + 1)
    for m in (plain, normalized):  # away from the zero-initialized last layer
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.3 * torch.randn_like(p))
    return [plain, normalized, DeterministicActor(5, 3, [16, 16], "relu")]


def test_ensemble_actor_is_the_members_mean_and_rebuilds():
    members = _members()
    ens = EnsembleActor(members)
    obs = torch.randn(32, 5)
    mean = (members[0].act(obs) + members[1].act(obs) + members[2].act(obs)) / 3
    assert torch.allclose(ens.act(obs), mean, atol=1e-7)
    spec = policy_spec(ens)
    assert (spec["kwargs"]["obs_dim"], spec["kwargs"]["act_dim"]) == (5, 3)  # what a residual's base loader reads
    rebuilt = build_policy(spec)
    rebuilt.load_state_dict(ens.state_dict())
    assert torch.equal(rebuilt.act(obs), ens.act(obs))
    with pytest.raises(ValueError, match="ensemble members"):
        EnsembleActor([members[0], DeterministicActor(4, 3, [8])])


def test_ensemble_program_is_the_mean():
    ens = EnsembleActor(_members())
    ops, obs_dim = program(ens)
    assert obs_dim == 5
    obs = torch.randn(64, 5)
    ref = ens.act(obs).double().numpy()
    assert np.abs(run_numpy(ops, obs.double().numpy()) - ref).max() < 1e-6
    assert (ProgramModule(fold(ops))(obs) - ens.act(obs)).abs().max() < 1e-6


def test_ensemble_of_composite_members_does_not_export():
    from embodied.policies import ResidualActor

    base = policy_spec(DeterministicActor(5, 3, [8]))
    residual = policy_spec(DeterministicActor(8, 3, [8]))
    with pytest.raises(UserError, match="composite"):
        program(EnsembleActor([ResidualActor(base, residual), ResidualActor(base, residual)]))


def test_members_get_their_own_envs_and_seeds(tmp_path):
    for name in ("run", "twin", "plain"):
        (tmp_path / name).mkdir()
    cfg = load_config("target", None, [*QUIET, "algo=td3", "ensemble=2", "num_envs=8", "seed=3",
                                       "td3.warmup_steps=32", "td3.batch_size=16", "ensemble_processes=false"])
    runner = build(cfg, tmp_path / "run")
    try:
        algo = runner.algo
        assert isinstance(algo, EnsembleAlgorithm) and len(algo.members) == 2
        a, b = algo.members
        assert a.num_envs == b.num_envs == 4
        assert [member_seed(3, k) for k in range(2)] == [3, 3 + 1_000_003]
        assert not torch.equal(a.pi.net[0].weight, b.pi.net[0].weight)  # own initializations
        runner.start()
        for _ in range(10):
            tr = runner.collect()
            algo.update()
        # member k stored exactly rows k * 4 .. k * 4 + 3 of the last batch
        last = {k: m.buffer.storage[m.buffer.size - 4:m.buffer.size] for k, m in enumerate(algo.members)}
        for k, rows in last.items():
            assert torch.equal(rows[:, a.buffer.slices["action"]], tr.action[4 * k:4 * k + 4])
        assert a.num_observed == b.num_observed == 40 and a.num_updates == b.num_updates > 0
        policy = algo.actor()
        obs = tr.next_obs["policy"]
        assert torch.allclose(policy.act(obs), (a.actor().act(obs) + b.actor().act(obs)) / 2)
        state = algo.state_dict()
    finally:
        runner.collector.close()
    twin = build(cfg, tmp_path / "twin")
    try:
        twin.algo.load_state_dict(state)
        for m, t in zip(algo.members, twin.algo.members):
            assert torch.equal(m.buffer.storage, t.buffer.storage) and m.num_updates == t.num_updates
            assert all(torch.equal(p, q) for p, q in zip(m.pi.parameters(), t.pi.parameters()))
        plain = build(load_config("target", None, [*QUIET, "algo=td3", "num_envs=8"]), tmp_path / "plain")
        plain.collector.close()
        with pytest.raises(UserError, match="ensemble=2"):
            twin.algo.load_state_dict(plain.algo.state_dict())
    finally:
        twin.collector.close()


def test_shared_replay_members_store_every_env_and_act_on_their_own(tmp_path):
    """``ensemble_replay=shared``: each member is built for all the run's envs, stores every env's transition (the
    same rows in every member's replay) and owes as many updates as a plain run; the action still comes from member
    k on slice k."""
    cfg = load_config("target", None, [*QUIET, "algo=td3", "ensemble=2", "num_envs=8", "seed=3",
                                       "td3.warmup_steps=32", "td3.batch_size=16", "ensemble_processes=false",
                                       "ensemble_replay=shared"])
    (tmp_path / "run").mkdir()
    runner = build(cfg, tmp_path / "run")
    try:
        algo = runner.algo
        a, b = algo.members
        assert algo.shared and a.num_envs == b.num_envs == 8
        runner.start()
        for _ in range(10):
            obs = runner.collector.obs
            tr = runner.collect()
            algo.update()
        assert a.num_observed == b.num_observed == 80 and a.num_updates == b.num_updates
        # a plain run's count: 0.2 per env step from the batch that reaches the warm-up (rows 25-32) on
        assert a.num_updates == int((80 - 24) * a.cfg.updates_per_step) == 11
        assert torch.equal(a.buffer.storage[:a.buffer.size], b.buffer.storage[:b.buffer.size])
        rows = a.buffer.storage[a.buffer.size - 8:a.buffer.size]
        assert torch.equal(rows[:, a.buffer.slices["action"]], tr.action)
        # past the warm-up each member acts on its own half, with its own actor (exploration noise aside)
        assert not torch.equal(a.actor().act(obs["policy"]), b.actor().act(obs["policy"]))
    finally:
        runner.collector.close()
    with pytest.raises(UserError, match="ensemble_replay must be own or shared"):
        build(load_config("target", None, [*QUIET, "algo=td3", "ensemble=2", "num_envs=8",
                                           "ensemble_replay=both"]), tmp_path / "bad")


@pytest.mark.parametrize("override", ["ensemble=3", "ensemble=0"])
def test_bad_ensemble_size(tmp_path, override):
    cfg = load_config("target", None, [*QUIET, "algo=td3", "num_envs=8", override])
    with pytest.raises(UserError, match="ensemble"):
        build(cfg, tmp_path / "run")


def test_members_in_processes_train_as_in_process(tmp_path):
    """The same ensemble with its members in processes of their own and in the run's process: the same policy,
    bit for bit (each member's randomness is its own generator and seed)."""
    overrides = [*QUIET, "algo=td3", "ensemble=2", "num_envs=16", "total_steps=1600", "log.eval_every=800",
                 "log.eval_episodes=8", "td3.warmup_steps=320", "td3.batch_size=64", "seed=1"]
    policies = {}
    for processes in ("true", "false"):
        run_dir, summary = train(load_config("target", None, [*overrides, f"ensemble_processes={processes}"]),
                                 tmp_path / processes)
        assert summary["step"] == 1600
        policies[processes] = load_policy(run_dir)
    obs = torch.rand(64, 2) * 2 - 1
    assert torch.equal(policies["true"].act(obs), policies["false"].act(obs))


def test_td3_ensemble_learns_target_and_exports(tmp_path, floors):
    """Two TD3 members, each on the single-learner test's budget (32 envs x 80 steps = 2560 env steps each); the
    run's policy (their mean) scores above the same floor, and exports with parity."""
    from embodied.hardware import export_run

    overrides = ["algo=td3", "ensemble=2", "num_envs=64", "total_steps=5120", "log.eval_every=0",
                 "td3.warmup_steps=320", "td3.batch_size=128", "td3.updates_per_step=0.25", "seed=0"]
    torch.set_num_threads(1)
    run_dir, summary = train(load_config("target", None, [*QUIET, *overrides]), tmp_path / "run")
    assert summary["step"] == 5120
    assert summary["eval/return"] >= floors["td3_target"], summary
    meta = export_run(run_dir, tmp_path / "bundle", "all")
    assert meta["parity"]["passed"], meta
    parity = json.loads((tmp_path / "bundle" / "parity.json").read_text())
    assert parity["c_vs_torch"] <= 1e-5 and parity["torch_vs_onnxruntime"] <= 1e-5


def test_a_member_process_reports_a_bad_setting_as_one_line(tmp_path):
    """A setting the learner refuses is raised in the member's process and arrives as the same ``UserError``."""
    cfg = load_config("target", None, [*QUIET, "algo=td3", "ensemble=2", "num_envs=8",
                                       "td3.exploration_noise_max=0.01"])
    (tmp_path / "run").mkdir()
    with pytest.raises(UserError, match="exploration_noise_max=0.01 is below"):
        build(cfg, tmp_path / "run")


def test_ppo_ensemble_learns_target(tmp_path, floors):
    """PPO members (their acting extras, log-probability and value, split and joined per member) on the single
    learner's test budget each (128 envs x 40 steps); the mean policy scores above the same floor."""
    overrides = ["algo=ppo", "ensemble=2", "num_envs=256", "total_steps=10240", "log.eval_every=0", "seed=0"]
    torch.set_num_threads(1)
    _, summary = train(load_config("target", None, [*QUIET, *overrides]), tmp_path / "run")
    assert summary["step"] == 10240
    assert summary["eval/return"] >= floors["ppo_target"], summary


@pytest.mark.timeout(300)
def test_bc_members_in_processes_each_clone_for_every_step(tmp_path, floors):
    """An offline learner's ensemble: the runner only updates, so each member's update answers its metrics before
    the next is sent (before, 2000 updates filled both pipes and the run hung, 0% CPU); each member makes all
    ``total_steps`` gradient steps (its own count, not the run's split as env steps are; the envs, which only
    evaluate, need not split either: 3 here), and the action mean of two clones scores above the single clone's
    floor."""
    from embodied.datasets import collect_demos

    collect_demos("reach", 20, tmp_path / "demos", num_envs=8, seed=0)
    overrides = ["algo=bc", f"data={tmp_path / 'demos'}", "ensemble=2", "num_envs=3", "total_steps=3000",
                 "bc.batch_size=32", "log.eval_every=0", "log.eval_episodes=50", "seed=0"]
    run_dir, summary = train(load_config("reach", None, [*QUIET, *overrides]), tmp_path / "run")
    assert summary["step"] == 3000
    assert summary["eval/success"] >= floors["bc_reach_success"], summary
    from embodied.checkpoint import load_checkpoint

    members = load_checkpoint(run_dir)["algo"]["members"]
    assert len(members) == 2 and all(m["num_updates"] == 3000 for m in members), [m.keys() for m in members]
