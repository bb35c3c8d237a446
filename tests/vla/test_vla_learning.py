"""The VLA learns through the runners: behaviour cloning on a language-conditioned state task, then RL fine-tuning
from it (init=RUN), and evaluation on held-out paraphrases."""

from __future__ import annotations

import pytest
import torch

from embodied.checkpoint import load_checkpoint
from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.datasets import collect_demos
from embodied.evaluate_run import evaluate_run
from embodied.metrics import read_metrics
from embodied.train import train
from tests.floors import FLOORS

QUIET = ["log.progress=false", "log.tensorboard=false", "log.eval_every=0", "log.eval_episodes=64"]


@pytest.fixture(scope="module")
def bc_run(minilm, tmp_path_factory):
    root = tmp_path_factory.mktemp("vla")
    collect_demos("point-reach-language", 40, root / "demos", num_envs=16)
    cfg = load_config("point-reach-language", None, [*QUIET, "algo=bc", f"data={root / 'demos'}", "policy.arch=vla",
                                                     "total_steps=400", "num_envs=16", "bc.batch_size=128"])
    run_dir, summary = train(cfg, root / "bc")
    return run_dir, summary


def test_bc_clones_a_language_task(bc_run):
    run_dir, summary = bc_run
    assert summary["eval/success"] >= FLOORS["bc_vla_point_reach_language_success"]
    heldout = evaluate_run(run_dir, episodes=64, env_overrides=["env.phrasing=heldout"])
    assert 0.0 <= heldout["eval/success"] <= 1.0  # measured (the gap is a figure, not a test): 0.08 vs 0.94


def test_grpo_fine_tunes_the_cloned_vla(bc_run, tmp_path, capsys):
    run_dir, _ = bc_run
    cfg = load_config("point-reach-language", None, [*QUIET, "algo=grpo", "policy.arch=vla", f"init={run_dir}",
                                                     "num_envs=64", "total_steps=20000"])
    from embodied.train import build

    (tmp_path / "probe").mkdir()
    runner = build(cfg, tmp_path / "probe")  # warm-started: the cloned weights, its normalizer frozen
    bc_state = load_checkpoint(run_dir)["policy"]["state"]
    for k, v in runner.algo.actor().state_dict().items():
        assert torch.equal(v, bc_state[k]), k
    assert runner.algo.actor().normalizer.frozen
    runner.collector.close()
    assert "the weights load" not in capsys.readouterr().err  # built alike: nothing to say
    # a setting the weights fit either way but that the clone was not built with: loaded, and said in one line
    other = load_config("point-reach-language", None, [*QUIET, "algo=grpo", "policy.arch=vla", f"init={run_dir}",
                                                       "num_envs=64", "policy.vla.query_gain=2"])
    (tmp_path / "probe2").mkdir()
    build(other, tmp_path / "probe2").collector.close()
    err = [ln for ln in capsys.readouterr().err.splitlines() if "the weights load" in ln]
    assert len(err) == 1 and "query_gain=1.0" in err[0]
    _, summary = train(cfg, tmp_path / "grpo")
    assert summary["eval/success"] >= FLOORS["grpo_vla_point_reach_language_success"]


def test_init_from_another_policy_is_one_clear_error(bc_run, tmp_path):
    run_dir, _ = bc_run
    cfg = load_config("point-reach-language", None, [*QUIET, "algo=grpo", f"init={run_dir}", "num_envs=8"])
    with pytest.raises(UserError, match="init="):
        train(cfg, tmp_path / "x")


def test_export_takes_the_instruction_as_an_input(bc_run, tmp_path):
    import numpy as np

    from embodied.checkpoint import policy_from_checkpoint
    from embodied.hardware.bundle import export_run, load_bundle

    run_dir, _ = bc_run
    meta = export_run(run_dir, tmp_path / "bundle", fmt="onnx", count=64)
    assert meta["parity"]["passed"] and meta["policy"]["inputs"] == ["obs", "instruction"]
    runner = load_bundle(tmp_path / "bundle")
    text = "move to the bottom right corner"
    runner.set_instruction(text)
    obs = np.load(tmp_path / "bundle" / "observations.npy")[:8]
    actor = policy_from_checkpoint(load_checkpoint(run_dir), run_dir).actor
    from embodied.vla.text import encode

    full = obs.copy()
    full[:, 2:] = encode([text])  # point-reach-language: [pos (2), instruction (384)]
    expected = actor(torch.from_numpy(full)).detach().numpy()
    assert np.allclose(runner.forward(obs[:, :2]), expected, atol=1e-5)
    assert np.allclose(runner.act(obs[0, :2]), expected[0], atol=1e-5)
    with pytest.raises(UserError, match="not one the bundle knows"):
        runner.set_instruction("fly to the moon")
    with pytest.raises(UserError, match="ONNX only"):
        export_run(run_dir, tmp_path / "c", fmt="c", count=64)


def test_term_token_vla_clones_and_exports_with_parity(bc_run, tmp_path):
    from embodied.hardware.bundle import export_run

    run_dir, _ = bc_run
    data = load_checkpoint(run_dir)["config"]["data"]
    cfg = load_config("point-reach-language", None, [*QUIET, "algo=bc", f"data={data}", "policy.arch=vla",
                                                     "policy.vla.state_encoder=tokens", "total_steps=50",
                                                     "num_envs=16", "bc.batch_size=64"])
    tokens_run, _ = train(cfg, tmp_path / "tokens")
    actor = load_checkpoint(tokens_run)["policy"]["spec"]
    assert actor["kwargs"]["terms"] == [[0, 2, 0]]  # point-reach-language: one state term, its position
    meta = export_run(tokens_run, tmp_path / "bundle", fmt="onnx", count=64)
    assert meta["parity"]["passed"]
    bad = load_config("point-reach-language", None, [*QUIET, "algo=bc", f"data={data}", "policy.arch=vla",
                                                     "policy.vla.state_encoder=graph"])
    with pytest.raises(UserError, match="state_encoder"):
        train(bad, tmp_path / "bad")
    bad = load_config("point-reach-language", None, [*QUIET, "algo=bc", f"data={data}", "policy.arch=vla",
                                                     "policy.vla.query_gain=0"])
    with pytest.raises(UserError, match="query_gain"):
        train(bad, tmp_path / "bad_gain")


def test_residual_learner_over_a_frozen_vla(bc_run, tmp_path):
    run_dir, bc_summary = bc_run
    # a mid-run evaluation of 64 episodes between rollouts of 16 envs: the frozen VLA's chunk queues are sized by
    # the batch each one runs (the rollouts' env-reset masks after an evaluation crashed residual-sac once)
    # policy.arch=vla (mini-libero's default) names the base; the residual is the MLP all the same
    cfg = load_config("point-reach-language", None, [*QUIET, "algo=residual-ppo", f"base={run_dir}", "num_envs=16",
                                                     "total_steps=4000", "log.eval_every=2000", "policy.arch=vla"])
    _, summary = train(cfg, tmp_path / "residual")
    # the residual starts at zero: the frozen clone's behaviour, kept while the residual learns (0.88 measured)
    assert summary["eval/success"] >= FLOORS["bc_vla_point_reach_language_success"] - 0.1


def test_bc_obs_noise_scales_state_entries_only(bc_run, tmp_path):
    from embodied.datasets import read_transitions
    from embodied.train import build

    run_dir, _ = bc_run
    data = load_checkpoint(run_dir)["config"]["data"]
    cfg = load_config("point-reach-language", None, [*QUIET, "algo=bc", f"data={data}", "policy.arch=vla",
                                                     "bc.obs_noise=0.5", "bc.holdout=0"])
    (tmp_path / "probe").mkdir()
    runner = build(cfg, tmp_path / "probe")
    state = read_transitions(data, ["policy"])["state"]
    scale = runner.algo.noise_scale  # point-reach-language: [pos (2), instruction (384)]
    assert torch.allclose(scale[:2], 0.5 * state[:, :2].std(0)) and bool((scale[2:] == 0).all())
    runner.algo.update()  # a noisy step runs
    runner.collector.close()
    with pytest.raises(UserError, match="obs_noise"):
        build(load_config("point-reach-language", None, [*QUIET, "algo=bc", f"data={data}", "policy.arch=vla",
                                                         "bc.obs_noise=-1"]), tmp_path / "probe")


def test_pointer_vla_learns_what_each_instruction_names_and_exports(minilm, tmp_path):
    # two mini-libero demonstrations per task (its defaults: pointers, bc.ground, the Gaussian head); the pointers
    # learn from the episodes' own labels (the cube each moved, where it came to rest) beside the cloning loss, and
    # the clone exports with parity like every VLA
    from embodied.hardware.bundle import export_run

    collect_demos("mini-libero", 26, tmp_path / "demos", num_envs=26)
    cfg = load_config("mini-libero", None, [*QUIET, "algo=bc", f"data={tmp_path / 'demos'}", "policy.arch=vla",
                                            "policy.vla.state_encoder=pointers", "bc.ground=1", "total_steps=300",
                                            "num_envs=13", "log.eval_episodes=13", "bc.batch_size=128",
                                            "log.log_every=50"])
    run_dir, _ = train(cfg, tmp_path / "bc")
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "bc/ground_hit" in r]
    assert rows[-1]["bc/ground_hit"] >= FLOORS["bc_vla_pointer_ground_hit"]
    assert rows[-1]["bc/ground_loss"] < rows[0]["bc/ground_loss"]
    meta = export_run(run_dir, tmp_path / "bundle", fmt="onnx", count=32)
    assert meta["parity"]["passed"]
    bad = load_config("mini-libero", None, [*QUIET, "algo=bc", f"data={tmp_path / 'demos'}", "policy.arch=vla",
                                            "policy.vla.state_encoder=mlp", "bc.ground=1"])
    with pytest.raises(UserError, match="bc.ground"):
        train(bad, tmp_path / "bad")


def test_filtered_bc_members_start_from_a_bc_ensemble_and_fine_tune_as_one(bc_run, tmp_path):
    """``algo=bc ensemble=2`` then ``algo=filtered-bc filtered-bc.members=2 init=RUN``: each member starts as the BC
    member it corresponds to, exactly; the run's policy stays the members' action mean (two VLAs), evaluated and
    reloaded as one."""
    from embodied import load_policy
    from embodied.policies import EnsembleActor
    from embodied.train import build

    data = load_checkpoint(bc_run[0])["config"]["data"]
    bc_dir, _ = train(load_config("point-reach-language", None, [
        *QUIET, "algo=bc", f"data={data}", "policy.arch=vla", "policy.vla.head=continuous", "total_steps=30",
        "num_envs=16", "bc.batch_size=64", "ensemble=2", "ensemble_processes=false"]), tmp_path / "bc")
    bc_members = load_checkpoint(bc_dir)["algo"]["members"]
    fbc = [*QUIET, "algo=filtered-bc", "policy.arch=vla", "policy.vla.head=continuous", f"init={bc_dir}",
           f"data={data}", "filtered-bc.members=2", "num_envs=16", "filtered-bc.grad_steps=2",
           "filtered-bc.batch_size=64", "total_steps=800"]
    (tmp_path / "probe").mkdir()
    runner = build(load_config("point-reach-language", None, fbc), tmp_path / "probe")
    runner.collector.close()
    for member, bc in zip(runner.algo.members, bc_members):
        assert all(torch.equal(p, bc["pi"][k]) for k, p in member.state_dict().items())
    run_dir, summary = train(load_config("point-reach-language", None, fbc), tmp_path / "fbc")
    assert summary["step"] >= 800 and 0.0 <= summary["eval/success"] <= 1.0
    policy = load_policy(run_dir)
    assert isinstance(policy.actor, EnsembleActor) and len(policy.actor.members) == 2
    with pytest.raises(UserError, match="continuous head"):  # the members' tokens have no mean to average
        train(load_config("point-reach-language", None, [*QUIET, "algo=filtered-bc", "policy.arch=vla",
                                                         "filtered-bc.members=2", "num_envs=16"]), tmp_path / "tokens")


def test_filtered_bc_ships_the_policy_its_rollouts_sample_and_exports_it(bc_run, tmp_path):
    """``filtered-bc.sampled_policy=true`` from a clone (init=): the run's policy (load_policy) samples around the
    clone's mean at the rollouts' temperature; its bundle's ONNX takes the noise as an input (parity on one fixed
    draw) and the runner draws it from the bundle's seed: the torch policy's actions on the same draws; init= from
    that run gives a run that takes the mean the same weights."""
    import numpy as np

    from embodied import load_policy
    from embodied.hardware.bundle import export_run, load_bundle
    from embodied.policies import SampledActor
    from embodied.train import build
    from embodied.vla.build import instruction_term
    from embodied.vla.export import split_instruction

    data = load_checkpoint(bc_run[0])["config"]["data"]
    head = ["policy.arch=vla", "policy.vla.head=continuous", f"data={data}", "num_envs=16"]
    bc_dir, _ = train(load_config("point-reach-language", None, [*QUIET, *head, "algo=bc", "total_steps=30",
                                                                 "bc.batch_size=64"]), tmp_path / "bc")
    fbc = [*QUIET, *head, "algo=filtered-bc", "filtered-bc.grad_steps=2", "filtered-bc.batch_size=64",
           "filtered-bc.temperature=0.5", "total_steps=400"]
    run_dir, _ = train(load_config("point-reach-language", None, [*fbc, f"init={bc_dir}",
                                                                  "filtered-bc.sampled_policy=true"]), tmp_path / "fbc")
    policy = load_policy(run_dir)
    assert isinstance(policy.actor, SampledActor) and policy.actor.temperature == 0.5
    meta = export_run(run_dir, tmp_path / "bundle", fmt="onnx", count=32)
    assert meta["parity"]["passed"] and meta["policy"]["noise"]["input"] == "noise"
    runner = load_bundle(tmp_path / "bundle")
    obs = np.load(tmp_path / "bundle" / "observations.npy")[:8]
    runner.reset()
    got = runner.forward(*split_instruction(obs, instruction_term(runner.layout)))
    noise = np.random.default_rng(meta["policy"]["noise"]["seed"]).standard_normal((8, 2)).astype(np.float32)
    with torch.no_grad():
        mean = policy.actor.dist(torch.from_numpy(obs)).mean.numpy()
        assert np.allclose(got, policy.actor(torch.from_numpy(obs), torch.from_numpy(noise)).numpy(), atol=1e-5)
    assert not np.allclose(got, mean, atol=1e-3)
    (tmp_path / "probe").mkdir()
    probe = build(load_config("point-reach-language", None, [*fbc, f"init={run_dir}"]), tmp_path / "probe")
    probe.collector.close()
    assert all(torch.equal(p, q) for p, q in zip(probe.algo.pi.parameters(), policy.actor.actor.parameters()))
