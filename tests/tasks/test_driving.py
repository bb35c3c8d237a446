"""Driving tasks: probing leaves the state untouched, observations and layout, rewards, the held-out split, the
video frame, and learning on the state-only variant."""

from __future__ import annotations

import pytest
import torch

import embodied
from embodied.tasks.driving.drive import ANCHORS, STATE_DIM


def test_probing_restores_state_exactly_and_prefers_the_road():
    env = embodied.make_env("drive-lane-keep", num_envs=4, seed=0, observation="state", probing=True)
    env.reset(seed=0)
    for _ in range(3):
        env.step(torch.zeros(4, 2))
    before = {k: v.clone() for k, v in env.sim.get_state().items()}
    tracked = [t.clone() for t in (env.arc, env.lateral, env.heading, env.index)]
    probe = env.probe()
    assert probe.shape == (4, len(ANCHORS)) and torch.isfinite(probe).all()
    for k, v in env.sim.get_state().items():
        assert torch.equal(v, before[k]), k
    for a, b in zip(tracked, (env.arc, env.lateral, env.heading, env.index)):
        assert torch.equal(a, b)
    # a car pointed at the kerb: hard steering back scores better than steering further out
    env.sim.x[0, 2] += 0.6  # heading 0.6 rad left of the road
    env.sim.x[0, 1] += 0.0
    p = env.probe()[0]
    assert p[ANCHORS.index((-0.8, 0.0))] > p[ANCHORS.index((0.8, 0.0))]
    _, _, _, _, info = env.step(torch.zeros(4, 2))
    assert "reward/probe" in info["log"]


def test_camera_observation_layout_and_reward_terms():
    env = embodied.make_env("drive-lane-keep", num_envs=2, seed=0)
    obs, _ = env.reset(seed=0)
    lay = env.layout()
    [(sl, shape)] = lay.images("policy")
    assert shape == (3, 64, 112) and sl == slice(0, 3 * 64 * 112)
    assert obs["policy"].shape == (2, 3 * 64 * 112 + 2) and obs["critic"].shape == (2, STATE_DIM + 2)
    img = obs["policy"][:, sl].reshape(2, 3, 64, 112)
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0
    # the lower half is road (grey), the upper half mostly sky (bluish)
    assert float(img[:, 2, :10].mean()) > float(img[:, 0, :10].mean())
    assert float(img[:, :, 50:].std(1).mean()) < 0.1
    _, reward, _, _, info = env.step(torch.tensor([[0.0, 0.3], [0.0, 0.3]]))
    terms = [k for k in info["log"] if k.startswith("reward/")]
    assert {"reward/survival", "reward/proximity", "reward/progress", "reward/alignment", "reward/comfort",
            "reward/collision", "reward/offroad"} <= set(terms)
    assert torch.isfinite(reward).all()


def test_held_out_scenes_for_evaluation_and_off_road_ends_the_episode():
    from embodied.core.registry import TASKS
    from embodied.sim_backends.splat.procedural import split_of

    spec = TASKS.get("drive-lane-keep")
    cfg = spec.eval_config(spec.config_cls())
    assert cfg.split == "test"
    env = embodied.make_env("drive-lane-keep", num_envs=2, seed=0, observation="state", split="test", scenes=2)
    assert all(split_of(r) == "test" for r in (0, 5))  # the first held-out indices
    env.reset(seed=0)
    done = torch.zeros(2, dtype=torch.bool)
    for _ in range(60):  # full left lock: leaves the road
        _, _, term, _, info = env.step(torch.tensor([[1.0, 1.0], [1.0, 1.0]]))
        done |= term
        if term.any():
            assert float(info["final_info"]["offroad"][term].min()) == 1.0
            assert float(info["final_info"]["success"][term].max()) == 0.0
            break
    assert done.any()


def test_video_frame_shows_camera_and_map():
    env = embodied.make_env("drive-lane-keep", num_envs=1, seed=0)
    env.reset(seed=0)
    frame = env.render_frame(0)
    assert frame.dtype.name == "uint8" and frame.shape[0] == 256 and frame.shape[1] > 256 + 256


def test_ppo_learns_lane_keeping_from_state(tmp_path):
    """The state-only variant with the task's PPO settings: held-out route completion >= 0.9 after 60k steps
    (measured 1.0, no collisions, ~20 s)."""
    from embodied.config import load_config
    from embodied.train import train

    cfg = load_config("drive-lane-keep", overrides=["env.observation=state", "total_steps=40000",
                                                    "log.eval_every=0", "log.eval_episodes=16",
                                                    "log.progress=false", "log.tensorboard=false",
                                                    f"log.run_root={tmp_path}"])
    _, summary = train(cfg)
    assert summary["eval/route_completion"] >= 0.9
    assert summary["eval/collision"] <= 0.1


def test_anchor_actions_train_a_categorical_ppo_head(tmp_path):
    """actions=anchors: MultiDiscrete([9, 9]); PPO builds a categorical head per dimension, samples indices, and its
    deterministic action is the most likely index; off-policy learners refuse it with one line."""
    import gymnasium as gym
    import pytest

    from embodied.config import load_config
    from embodied.core.errors import UserError
    from embodied.policies.actor_critic import CategoricalActor, MultiCategorical
    from embodied.train import train

    env = embodied.make_env("drive-lane-keep", num_envs=2, observation="state", actions="anchors")
    assert isinstance(env.single_action_space, gym.spaces.MultiDiscrete)
    env.reset(seed=0)
    env.step(torch.tensor([[8.0, 4.0], [0.0, 4.0]]))  # full left lock / full right lock, coasting
    assert float(env.sim.x[0, 4]) > 0 > float(env.sim.x[1, 4])
    # the categorical distribution, exactly
    logits = [torch.log(torch.tensor([[0.2, 0.8]])), torch.log(torch.tensor([[0.5, 0.25, 0.25]]))]
    d = MultiCategorical(logits)
    assert d.log_prob(torch.tensor([[1.0, 2.0]])).exp()[0].tolist() == pytest.approx([0.8, 0.25])
    assert d.mode.tolist() == [[1.0, 0.0]]
    cfg = load_config("drive-lane-keep", overrides=["env.observation=state", "env.actions=anchors",
                                                    "total_steps=2048", "log.eval_every=0", "log.eval_episodes=4",
                                                    "log.progress=false", "log.tensorboard=false",
                                                    f"log.run_root={tmp_path}"])
    run_dir, summary = train(cfg)
    assert "eval/route_completion" in summary
    policy = embodied.load_policy(run_dir)
    assert isinstance(policy.actor, CategoricalActor)
    a = policy.act(torch.zeros(3, STATE_DIM))
    assert a.shape == (3, 2) and torch.equal(a, a.round()) and (a >= 0).all() and (a <= 8).all()
    td3 = load_config("drive-lane-keep", overrides=["algo=td3", "env.observation=state", "env.actions=anchors",
                                                    f"log.run_root={tmp_path}"])
    with pytest.raises(UserError, match="continuous"):
        train(td3)


def test_moving_cars_drive_are_drawn_and_collide():
    """drive-avoid: moving cars advance along the route, both renderers draw them (numba == torch), and driving
    into one ends the episode as a collision."""
    env = embodied.make_env("drive-avoid", num_envs=2, seed=0, scenes=1, blocking_cars=(0, 0), far=15.0,
                            image_height=40, image_width=56,
                            moving_ahead=(8.0, 9.0), moving_lateral=(0.0, 0.05), moving_speed=(1.0, 1.0))
    env.reset(seed=0)
    arc0 = env.sim.movers[:, :, 0].clone()
    fast = env.sim.render()
    env.sim.kernel = "torch"
    slow = env.sim.render()
    env.sim.kernel = "auto"
    diff = (fast - slow).abs()  # float32 kernel vs float64 reference: a stop rule may flip on a rare pixel
    assert float(diff.mean()) < 1e-4 and float((diff > 1e-3).float().mean()) < 1e-3
    red = (fast[:, 0, 0] > 0.6) & (fast[:, 0, 1] < 0.3)  # slot 0's car is red
    assert int(red.sum()) > 30
    hit = torch.zeros(2, dtype=torch.bool)
    for _ in range(40):  # full throttle into the car ahead
        _, _, term, _, info = env.step(torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
        if term.any():
            assert float(info["final_info"]["collision"][term].min()) == 1.0
            hit |= term
            break
    assert hit.any()
    assert (env.sim.movers[~hit, :, 0] > arc0[~hit]).all() or hit.all()


def test_frame_stack_shifts_frames_and_survives_a_checkpoint():
    env = embodied.make_env("drive-lane-keep", num_envs=2, seed=0, frame_stack=3, image_height=40, image_width=56)
    obs, _ = env.reset(seed=0)
    c = 3 * 40 * 56
    img = obs["policy"][:, :3 * c].reshape(2, 3, c)
    assert torch.equal(img[:, 0], img[:, 2]) and torch.equal(img[:, 1], img[:, 2])  # first frame fills the stack
    obs2, *_ = env.step(torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    img2 = obs2["policy"][:, :3 * c].reshape(2, 3, c)
    assert torch.equal(img2[:, 1], img[:, 2]) and not torch.equal(img2[:, 2], img[:, 2])  # shifted by one
    state = env.state_dict()
    act = torch.tensor([[0.2, 0.5], [-0.2, 0.5]])
    expected = env.step(act)[0]["policy"]
    fresh = embodied.make_env("drive-lane-keep", num_envs=2, seed=5, frame_stack=3, image_height=40, image_width=56)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.step(act)[0]["policy"], expected)


def test_arriving_pays_the_bonuses_of_the_steps_left():
    env = embodied.make_env("drive-lane-keep", num_envs=1, seed=0, observation="state", scenes=1,
                            start_arc=(88.0, 88.0), start_lateral=0.0, start_heading=0.0, start_speed=(10.0, 10.0))
    env.reset(seed=0)
    w = env.weights
    steps = 0
    while steps < 40:
        _, _, term, _, info = env.step(torch.tensor([[0.0, 0.0]]))
        steps += 1
        if term.any():
            break
    assert float(info["final_info"]["success"][0]) == 1.0
    expected = (env.max_episode_steps - steps) * (w["survival"] + w["proximity"] + w["alignment"])
    assert float(info["log"]["reward/arrival"]) == pytest.approx(expected)


def test_standing_still_earns_no_bonus_and_half_speed_earns_half():
    env = embodied.make_env("drive-lane-keep", num_envs=3, seed=0, observation="state", scenes=1,
                            start_arc=(20.0, 20.0), start_lateral=0.0, start_heading=0.0)
    env.reset(seed=0)
    env.step(torch.zeros(3, 2))
    env.sim.x[:, 3] = torch.tensor([0.0, 1.5, 6.0])  # standing, half the bonus speed (3 m/s), twice it
    terms = env._compute(torch.zeros(3, 2)).reward_terms
    w = env.weights
    assert env.cfg.bonus_speed == 3.0
    assert torch.allclose(terms["survival"], w["survival"] * torch.tensor([0.0, 0.5, 1.0]))
    on_path = (env.lateral.abs() < 0.5) & ((env.sim.x[:, 2] - env.heading).abs() < 0.087)
    assert bool(on_path.all())
    assert torch.allclose(terms["proximity"], w["proximity"] * torch.tensor([0.0, 0.5, 1.0]))
    assert torch.allclose(terms["alignment"], w["alignment"] * torch.tensor([0.0, 0.5, 1.0]))
