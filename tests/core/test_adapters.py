"""Adapters to gymnasium and Stable-Baselines3 (embodied/core/adapters.py)."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import embodied
import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.core import adapters
from embodied.core.adapters import GymnasiumVectorEnv, SingleEnv
from embodied.core.base import VecEnv
from embodied.core.errors import UserError
from embodied.core.registry import TASKS

TARGET_STEPS = 10  # target's default episode length


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# ---- SingleEnv ------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS.names())
def test_single_env_passes_gymnasium_check_env(task):
    env = SingleEnv(embodied.make_env(task, num_envs=1, seed=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    # the only warnings allowed are about unbounded observation boxes, which a task may declare
    unexpected = [str(w.message) for w in caught if "infinity" not in str(w.message)]
    assert unexpected == []


def test_single_env_shows_episode_end_without_autoreset():
    raw = embodied.make_env("target", num_envs=1, seed=5)
    env = SingleEnv(embodied.make_env("target", num_envs=1, seed=5))
    obs, info = env.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    np.testing.assert_array_equal(obs["policy"], _np(raw_obs["policy"][0]))
    assert obs["policy"].dtype == np.float32 and obs["policy"].shape == (2,)
    action = np.full(2, 0.25, dtype=np.float32)
    for t in range(1, TARGET_STEPS + 1):
        obs, reward, terminated, truncated, info = env.step(action)
        raw_obs, raw_reward, _, _, raw_info = raw.step(torch.as_tensor(action)[None])
        assert isinstance(reward, float) and reward == float(raw_reward[0])
        assert terminated is False and truncated is (t == TARGET_STEPS)
        assert set(info["log"]) == set(raw_info["log"])
    # the last observation of the episode, not the first of the inner env's next one
    np.testing.assert_array_equal(obs["policy"], _np(raw_info["final_obs"]["policy"][0]))
    assert not np.array_equal(obs["policy"], _np(raw_obs["policy"][0]))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(action)
    obs, _ = env.reset()
    assert obs["policy"].shape == (2,)
    env.step(action)


def test_single_env_reports_episode_outcome():
    env = SingleEnv(embodied.make_env("quadrotor-hover", num_envs=1, seed=0))
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(600):
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert terminated or truncated
    assert info["success"] in (0.0, 1.0)
    assert set(obs) == {"policy", "critic"} and all(np.isfinite(v).all() for v in obs.values())


def test_single_env_needs_one_env():
    with pytest.raises(ValueError, match="num_envs=1"):
        SingleEnv(embodied.make_env("target", num_envs=2))


# ---- GymnasiumVectorEnv ---------------------------------------------------------------------------
def test_gymnasium_vector_env_spaces_and_dtypes():
    env = embodied.to_gymnasium(embodied.make_env("quadrotor-hover", num_envs=3, seed=0))
    assert isinstance(env, gym.vector.VectorEnv)
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert env.num_envs == 3
    assert isinstance(env.single_observation_space, gym.spaces.Dict)
    assert set(env.observation_space.spaces) == {"policy", "critic"}
    assert env.observation_space["policy"].shape == (3, *env.single_observation_space["policy"].shape)
    assert env.action_space.shape == (3, 4)
    obs, info = env.reset(seed=1)
    assert isinstance(info, dict)
    assert obs in env.observation_space
    env.action_space.seed(0)
    obs, reward, terminated, truncated, infos = env.step(env.action_space.sample())
    assert obs in env.observation_space
    for group, space in env.single_observation_space.spaces.items():
        assert obs[group].shape == (3, *space.shape) and obs[group].dtype == np.float32
    assert reward.shape == (3,) and reward.dtype == np.float32
    assert terminated.shape == truncated.shape == (3,)
    assert terminated.dtype == truncated.dtype == np.bool_
    assert all(isinstance(v, float) for v in infos["log"].values())
    env.close()
    assert env.closed


def test_gymnasium_vector_env_matches_inner_env_and_same_step_autoreset():
    n = 4
    raw = embodied.make_env("target", num_envs=n, seed=9)
    env = GymnasiumVectorEnv(embodied.make_env("target", num_envs=n, seed=9))
    obs, _ = env.reset(seed=2)
    raw_obs, _ = raw.reset(seed=2)
    np.testing.assert_array_equal(obs["policy"], _np(raw_obs["policy"]))
    env.action_space.seed(0)
    finishes = 0
    for t in range(1, 2 * TARGET_STEPS + 4):
        action = env.action_space.sample()
        obs, reward, terminated, truncated, infos = env.step(action)
        raw_obs, raw_reward, raw_term, raw_trunc, raw_info = raw.step(torch.as_tensor(action))
        np.testing.assert_array_equal(obs["policy"], _np(raw_obs["policy"]))
        np.testing.assert_array_equal(reward, _np(raw_reward))
        np.testing.assert_array_equal(terminated, _np(raw_term))
        np.testing.assert_array_equal(truncated, _np(raw_trunc))
        done = terminated | truncated
        ends_now = t % TARGET_STEPS == 0
        assert done.all() == ends_now and done.any() == ends_now
        # final_obs present exactly when an env finishes
        assert ("final_obs" in infos) == ends_now
        if ends_now:
            finishes += 1
            np.testing.assert_array_equal(infos["_final_obs"], done)
            np.testing.assert_array_equal(infos["_final_info"], done)
            assert infos["final_info"] == {}  # target reports no episode outcome
            for i in range(n):
                final = infos["final_obs"][i]
                np.testing.assert_array_equal(final["policy"], _np(raw_info["final_obs"]["policy"][i]))
                assert not np.array_equal(final["policy"], obs["policy"][i])  # obs is the next episode's
    assert finishes == 2


def test_gymnasium_vector_env_partial_done_masks():
    n = 6
    env = embodied.to_gymnasium(embodied.make_env("quadrotor-hover", num_envs=n, seed=0))
    env.reset(seed=0)
    env.action_space.seed(1)
    partial = False
    for _ in range(200):
        obs, _, terminated, truncated, infos = env.step(env.action_space.sample())
        done = terminated | truncated
        assert ("final_obs" in infos) == done.any()
        if done.any():
            np.testing.assert_array_equal(infos["_final_obs"], done)
            for i in range(n):
                assert (infos["final_obs"][i] is None) == (not done[i])
            np.testing.assert_array_equal(infos["final_info"]["_success"], done)
            assert np.all(infos["final_info"]["success"][~done] == 0)
            partial |= bool(done.any() and not done.all())
    assert partial, "random actions should crash some quadrotors but not all at once"


def test_gymnasium_record_episode_statistics_sees_episodes():
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        embodied.to_gymnasium(embodied.make_env("target", num_envs=3, seed=0))
    )
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(TARGET_STEPS):
        _, _, _, _, infos = env.step(env.action_space.sample())
    np.testing.assert_array_equal(infos["episode"]["l"], [TARGET_STEPS] * 3)


def test_gymnasium_reset_rejects_per_env_seeds_and_options():
    env = embodied.to_gymnasium(embodied.make_env("target", num_envs=2))
    with pytest.raises(TypeError, match="seed"):
        env.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="options"):
        env.reset(options={"x": 1})


def test_gymnasium_policy_obs_is_a_flat_box_with_same_step_final_obs():
    n = 3
    raw = embodied.make_env("quadrotor-hover", num_envs=n, seed=2)
    env = embodied.to_gymnasium(embodied.make_env("quadrotor-hover", num_envs=n, seed=2), obs="policy")
    policy_space = raw.single_observation_space["policy"]
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert env.single_observation_space == policy_space
    assert env.observation_space == gym.vector.utils.batch_space(policy_space, n)
    obs, _ = env.reset(seed=0)
    raw_obs, _ = raw.reset(seed=0)
    np.testing.assert_array_equal(obs, _np(raw_obs["policy"]))
    rng = np.random.default_rng(0)
    for _ in range(200):
        action = rng.uniform(-1, 1, size=(n, 4)).astype(np.float32)
        obs, reward, terminated, truncated, infos = env.step(action)
        raw_obs, raw_reward, _, _, raw_info = raw.step(torch.as_tensor(action))
        assert isinstance(obs, np.ndarray) and obs.shape == (n, *policy_space.shape)
        np.testing.assert_array_equal(obs, _np(raw_obs["policy"]))
        done = terminated | truncated
        if done.any():
            for i in range(n):
                if done[i]:
                    assert isinstance(infos["final_obs"][i], np.ndarray)
                    np.testing.assert_array_equal(infos["final_obs"][i], _np(raw_info["final_obs"]["policy"][i]))
                else:
                    assert infos["final_obs"][i] is None
            return
    pytest.fail("no quadrotor episode ended in 200 random steps")


def test_to_gymnasium_modes_are_checked():
    inner = embodied.make_env("target", num_envs=2)
    env = embodied.to_gymnasium(inner, autoreset=gym.vector.AutoresetMode.NEXT_STEP)  # the enum is taken too
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    with pytest.raises(ValueError, match="autoreset"):
        embodied.to_gymnasium(inner, autoreset="next")
    with pytest.raises(ValueError, match="DISABLED"):
        embodied.to_gymnasium(inner, autoreset=gym.vector.AutoresetMode.DISABLED)
    with pytest.raises(ValueError, match="obs"):
        embodied.to_gymnasium(inner, obs="critic")
    with pytest.raises(ValueError, match="obs"):
        SingleEnv(embodied.make_env("target", num_envs=1), obs="flat")


def test_next_step_needs_per_env_reset_hooks():
    class Minimal(VecEnv):  # the bare VecEnv contract: no per-env reset
        num_envs, device, max_episode_steps = 2, torch.device("cpu"), 5
        single_observation_space = gym.spaces.Dict({"policy": gym.spaces.Box(-1, 1, (1,), np.float32)})
        single_action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

        def reset(self, seed=None):
            return {"policy": torch.zeros(2, 1)}, {}

        def step(self, action):
            raise NotImplementedError

    assert embodied.to_gymnasium(Minimal()).metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    with pytest.raises(ValueError, match="ManagedVecEnv"):
        embodied.to_gymnasium(Minimal(), autoreset="next_step")


def test_next_step_checks_the_action_shape():
    env = embodied.to_gymnasium(embodied.make_env("target", num_envs=2), autoreset="next_step")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((3, 2), dtype=np.float32))


def test_single_env_policy_obs():
    env = SingleEnv(embodied.make_env("pendulum", num_envs=1, seed=0, episode_steps=2), obs="policy")
    assert isinstance(env.observation_space, gym.spaces.Box) and env.observation_space.shape == (3,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3,) and obs in env.observation_space
    obs, _, _, truncated, _ = env.step(np.zeros(1, dtype=np.float32))
    obs, _, _, truncated, _ = env.step(np.zeros(1, dtype=np.float32))
    assert truncated and obs.shape == (3,)


# ---- SB3VecEnv ------------------------------------------------------------------------------------
needs_sb3 = pytest.mark.skipif(
    importlib.util.find_spec("stable_baselines3") is None, reason="Stable-Baselines3 not installed"
)


@needs_sb3
def test_sb3_vec_env_shapes_and_terminal_observation():
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import VecEnv as SB3BaseVecEnv

    n = 3
    raw = embodied.make_env("target", num_envs=n, seed=4)
    venv = embodied.to_sb3(embodied.make_env("target", num_envs=n, seed=4))
    assert isinstance(venv, SB3BaseVecEnv) and isinstance(venv, adapters.SB3VecEnv)
    assert venv.observation_space == raw.single_observation_space["policy"]
    assert venv.action_space == raw.single_action_space
    venv.seed(7)
    obs = venv.reset()
    raw_obs, _ = raw.reset(seed=7)
    assert obs.shape == (n, 2) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs, _np(raw_obs["policy"]))
    returns = np.zeros(n)
    rng = np.random.default_rng(0)
    for t in range(1, TARGET_STEPS + 3):
        action = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
        obs, reward, dones, infos = venv.step(action)
        raw_obs, raw_reward, _, _, raw_info = raw.step(torch.as_tensor(action))
        returns += reward
        assert obs.shape == (n, 2) and obs.dtype == np.float32
        assert reward.shape == (n,) and reward.dtype == np.float32
        assert dones.shape == (n,) and dones.dtype == np.bool_
        assert len(infos) == n
        np.testing.assert_array_equal(obs, _np(raw_obs["policy"]))
        ends_now = t == TARGET_STEPS
        assert dones.all() == ends_now and dones.any() == ends_now
        for i, info in enumerate(infos):
            assert ("terminal_observation" in info) == ends_now
            assert ("episode" in info) == ends_now
            assert "is_success" not in info  # target reports no success outcome
            assert info["TimeLimit.truncated"] == ends_now  # episodes end by time limit only
            if ends_now:
                term = info["terminal_observation"]
                assert term.shape == (2,) and term.dtype == np.float32
                np.testing.assert_array_equal(term, _np(raw_info["final_obs"]["policy"][i]))
                assert info["episode"]["l"] == TARGET_STEPS
                assert info["episode"]["r"] == pytest.approx(returns[i], rel=1e-6)
        if ends_now:
            returns[:] = 0
    assert venv.get_attr("render_mode") == [None] * n
    assert venv.get_attr("max_episode_steps", indices=[0, 2]) == [TARGET_STEPS] * 2
    assert venv.env_is_wrapped(Monitor) == [True] * n
    assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [False] * n
    assert venv.env_method("state_dict")[0]["episode_length"].shape == (n,)
    venv.set_attr("some_flag", 3)
    assert venv.get_attr("some_flag") == [3] * n
    with pytest.raises(ValueError, match="all indices"):
        venv.set_attr("some_flag", 4, indices=[1])
    with pytest.raises(AttributeError):
        venv.get_attr("no_such_attribute")
    assert venv.get_images() == [None] * n
    venv.close()


@needs_sb3
def test_sb3_vec_env_reports_success():
    venv = embodied.to_sb3(embodied.make_env("quadrotor-hover", num_envs=4, seed=0))
    venv.reset()
    rng = np.random.default_rng(0)
    for _ in range(200):
        _, _, dones, infos = venv.step(rng.uniform(-1, 1, size=(4, 4)).astype(np.float32))
        for done, info in zip(dones, infos):
            assert ("is_success" in info) == done
            if done:
                assert info["terminal_observation"].shape == venv.observation_space.shape
                assert np.isfinite(info["terminal_observation"]).all()
        if dones.any():
            return
    pytest.fail("no quadrotor episode ended in 200 random steps")


def test_sb3_missing_is_a_user_error(monkeypatch):
    for name in [m for m in sys.modules if m == "stable_baselines3" or m.startswith("stable_baselines3.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UserError, match=r"embodied\[sb3\]"):
        adapters._sb3_vec_env_class.__wrapped__()


@needs_sb3
def test_sb3_ppo_learns_on_pendulum_through_to_sb3():
    from stable_baselines3 import PPO

    venv = embodied.to_sb3(embodied.make_env("pendulum", num_envs=8, seed=0))
    model = PPO("MlpPolicy", venv, n_steps=256, batch_size=256, n_epochs=2, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=4096)
    assert model.num_timesteps >= 4096
    assert len(model.ep_info_buffer) >= 8  # 8 envs x 512 steps = 16 episodes of 200 steps
    assert all(ep["l"] == 200 and np.isfinite(ep["r"]) for ep in model.ep_info_buffer)


@needs_sb3
def test_sb3_evaluate_policy_on_adapter():
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy

    venv = embodied.to_sb3(embodied.make_env("target", num_envs=4, seed=0))
    model = PPO("MlpPolicy", venv, n_steps=16, batch_size=64, seed=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "not wrapped with a Monitor" would mean lost episodes
        returns, lengths = evaluate_policy(model, venv, n_eval_episodes=8, return_episode_rewards=True)
    assert len(returns) == len(lengths) == 8
    assert lengths == [TARGET_STEPS] * 8
    # reward per step is 1 - |a - t|^2 <= 1
    assert all(np.isfinite(r) and r <= TARGET_STEPS for r in returns)
