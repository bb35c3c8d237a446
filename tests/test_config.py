"""Run configs: the learner's section is named after the algorithm; keys of another algorithm are
refused on the command line and skipped in YAML; task families resolve through their factory."""

import dataclasses

import pytest

from embodied.algos.ppo import PPOConfig
from embodied.algos.sac import SACConfig
from embodied.algos.td3 import TD3Config
from embodied.config import config_from_dict, load_config, to_dict
from embodied.core.errors import UserError
from embodied.core.registry import TASKS, register_task_family


def test_algo_section_resolves_into_algo_config():
    cfg = load_config("quadrotor-hover", overrides=["td3.batch_size=64"])
    assert cfg.algo == "td3" and isinstance(cfg.algo_config, TD3Config) and cfg.algo_config.batch_size == 64
    assert cfg.algo_config.tau == 0.01  # from the task YAML, whose sac: section is skipped
    cfg = load_config("quadrotor-hover", overrides=["algo=sac", "sac.batch_size=32"])
    assert isinstance(cfg.algo_config, SACConfig) and cfg.algo_config.batch_size == 32
    assert cfg.algo_config.symmetry_augmentation  # the YAML's sac: section
    assert isinstance(load_config("pendulum").algo_config, PPOConfig)


def test_key_of_an_algorithm_the_run_does_not_train_is_refused():
    with pytest.raises(UserError, match="this run trains td3"):
        load_config("quadrotor-hover", overrides=["sac.batch_size=256"])
    with pytest.raises(UserError, match="algo_config"):
        load_config("pendulum", overrides=["algo_config.lr=1"])
    with pytest.raises(UserError, match="unknown algorithm"):
        load_config("pendulum", overrides=["algo=nope"])


def test_debug_preset_holds_sections_for_several_algorithms():
    for algo in ("ppo", "sac", "td3"):
        cfg = load_config("pendulum", "debug", [f"algo={algo}"])
        assert cfg.algo == algo and cfg.total_steps == 2048


def test_pick_place_preset_ships_both_residual_learners_average():
    """pick-place's preset is the measured residual recipe for residual-sac and residual-td3 alike: the deployed
    policy is a slow average of the residual (average_tau 0.0005) and the critics have LayerNorm; plain TD3 keeps
    its own defaults."""
    for algo in ("residual-sac", "residual-td3"):
        cfg = load_config("pick-place", overrides=[f"algo={algo}"])
        assert (cfg.algo_config.deploy_average, cfg.algo_config.average_tau) == (True, 0.0005)
        assert cfg.policy.critic_layer_norm
    td3 = load_config("pick-place", overrides=["algo=td3"]).algo_config
    assert (td3.deploy_average, td3.average_tau) == (False, None)


def test_saved_config_round_trips_under_the_algorithm_name():
    cfg = load_config("quadrotor-hover", overrides=["td3.batch_size=64"])
    data = to_dict(cfg)
    assert "td3" in data and "algo_config" not in data and "sac" not in data
    assert config_from_dict(data) == cfg


def test_task_family_resolves_through_its_factory():
    base = TASKS.get("target")

    def factory(rest: str):
        if rest not in ("easy", "hard"):
            raise UserError(f"unknown variant {rest!r}; known: easy, hard")
        return dataclasses.replace(base, name=f"testfam:{rest}")

    register_task_family("testfam", factory, "variants of target (test)")
    try:
        _check_family()
    finally:  # leave the registries as other tests (the conformance sweep) expect them
        TASKS.families.pop("testfam")
        for name in [n for n in TASKS.names() if n.startswith("testfam:")]:
            TASKS._entries.pop(name)


def _check_family():
    assert TASKS.get("testfam:easy").name == "testfam:easy"
    assert TASKS.get("testfam:easy") is TASKS.get("testfam:easy")  # built once
    with pytest.raises(UserError, match="unknown variant"):
        TASKS.get("testfam:nope")
    with pytest.raises(UserError, match="known families: .*testfam:"):
        TASKS.get("nofam:x")
    cfg = load_config("testfam:hard", "debug")
    assert cfg.task == "testfam:hard"


def test_section_of_the_algorithm_a_config_extends_applies_first():
    from embodied.algos.appo import APPOConfig

    cfg = load_config("target", overrides=["algo=appo", "appo.rho_bar=0.5"])
    assert isinstance(cfg.algo_config, APPOConfig)
    assert cfg.algo_config.num_steps == 10 and cfg.algo_config.rho_bar == 0.5  # ppo: section of target.yaml
    cfg = load_config("target", overrides=["algo=appo", "ppo.num_steps=7", "appo.num_steps=9"])
    assert cfg.algo_config.num_steps == 9


def test_cli_overrides_may_follow_options(tmp_path):
    from embodied.cli import main

    run_dir = tmp_path / "r"
    code = main(["train", "--task", "target", "seed=1", "--preset", "debug", "--run-dir", str(run_dir),
                 "total_steps=64", "log.progress=false", "log.tensorboard=false"])
    assert code == 0
    import yaml

    from embodied.config import config_from_dict

    cfg = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert cfg.seed == 1 and cfg.total_steps == 64
    assert main(["train", "--task", "target", "--run-dir", str(tmp_path / "x"), "bogus"]) == 2


def test_runtime_sim_threads_reaches_the_task():
    """``runtime.sim_threads`` (once a key nothing read) sets a MuJoCo task's stepping threads; on a tensor task, or
    below 1, it is one UserError line; a saved config that still says 1 reads back."""
    cfg = load_config("pick-place", None, ["runtime.sim_threads=2"])
    assert cfg.env.sim_threads == 2
    assert load_config("pick-place").env.sim_threads == 1
    assert config_from_dict(to_dict(cfg)).env.sim_threads == 2
    old = to_dict(load_config("quadrotor-hover"))
    old["runtime"]["sim_threads"] = 1  # what every run saved before
    assert config_from_dict(old).runtime.sim_threads == 1
    with pytest.raises(UserError, match="no native threads"):
        load_config("quadrotor-hover", None, ["runtime.sim_threads=2"])
    with pytest.raises(UserError, match=">= 1"):
        load_config("halfcheetah", None, ["runtime.sim_threads=0"])


def test_a_saved_config_without_a_newer_setting_runs_as_it_ran():
    """A task setting added after a run was saved takes the value the run had (the config class's SAVED_BEFORE),
    not the new default; a run whose policy reads another observation size than its task gives is one line."""
    import embodied
    from embodied.evaluate_run import _check_inputs

    data = to_dict(load_config("quadrotor-hover"))
    assert data["env"]["position_average_s"] == 1.0  # the default now
    assert config_from_dict(data).env.position_average_s == 1.0
    del data["env"]["position_average_s"]  # a run saved before the setting existed
    assert config_from_dict(data).env.position_average_s == 0.0
    assert data["env"]["reward"]["floor"] == 0.0 and config_from_dict(data).env.reward.floor == 0.0
    del data["env"]["reward"]["floor"]  # nested: the reward section of a run saved before the floor
    assert config_from_dict(data).env.reward.floor is None
    assert config_from_dict(data).env.reward.position_abs == data["env"]["reward"]["position_abs"]
    assert config_from_dict(data).env.domain_randomization.hard_share == 0.25
    del data["env"]["domain_randomization"]["hard_factors"]  # saved before the hard factors: mass and thrust constant
    assert config_from_dict(data).env.domain_randomization.hard_factors == ["mass", "thrust_constant"]
    del data["env"]["domain_randomization"]["hard_share"]  # a randomized run saved before the hard share: uniform
    assert config_from_dict(data).env.domain_randomization.hard_share == 0.0
    env = embodied.make_env("quadrotor-hover")
    ckpt = {"policy": {"spec": {"name": "deterministic_mlp", "kwargs": {"obs_dim": 82}}}, "config": data}
    with pytest.raises(UserError, match="reads 82 observation entries; task quadrotor-hover gives 85"):
        _check_inputs(ckpt, env, "RUN")
    ckpt["policy"]["spec"]["kwargs"]["obs_dim"] = 85
    _check_inputs(ckpt, env, "RUN")


def test_a_model_trained_learner_is_the_real_tasks_own():
    """``wm:quadrotor-hover`` trains the learner of quadrotor-hover's preset in the model (dream-to-real compares
    the two): the same policy settings and the same TD3 but for what the model run sets by design (its warm-up,
    update ratio, buffer and evaluation cadence), and LayerNorm critics, measured worse in the model."""
    real, model = load_config("quadrotor-hover"), load_config("wm:quadrotor-hover")
    # the one measured exception: LayerNorm critics (configs/wm-quadrotor-hover.yaml says why)
    assert real.policy.critic_layer_norm and not model.policy.critic_layer_norm
    assert model.algo == real.algo == "td3"
    assert dataclasses.replace(model.policy, critic_layer_norm=True) == real.policy
    by_design = {"warmup_steps", "updates_per_step", "buffer_size", "kernel_threads"}
    differ = {f.name for f in dataclasses.fields(real.algo_config)
              if getattr(real.algo_config, f.name) != getattr(model.algo_config, f.name)}
    assert differ <= by_design, differ - by_design
