"""quadrotor-hover MDP details: success rule, termination, observations, randomization, curriculum."""

import math

import pytest
import torch

import embodied
from embodied.core.errors import UserError
from embodied.kernels.quadrotor import GRAVITY
from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams

HOVER = 2 * QuadrotorParams().hover_rpm / QuadrotorParams().rpm_max - 1  # normalized hover command


def hovering_env(num_envs, **kw):
    """Envs placed level at rest with motors at hover rpm and no disturbance or noise."""
    env = embodied.make_env("quadrotor-hover", num_envs=num_envs, disturbance_force=0.0, disturbance_torque=0.0,
                            obs_noise_position=0.0, obs_noise_orientation=0.0, obs_noise_lin_vel=0.0,
                            obs_noise_ang_vel=0.0, **kw)
    env.reset(seed=0)
    x = torch.zeros(num_envs, 17)
    x[:, 3] = 1.0
    x[:, 13:] = QuadrotorParams().hover_rpm
    env.sim.set_state_idx(torch.arange(num_envs), x)
    return env


def run_to_end(env, offsets_at):
    """Hold hover; at step t move env i to (offsets_at[t][i], 0, 0). Returns the last info."""
    action = torch.full((env.num_envs, 4), HOVER)
    for t in range(env.max_episode_steps):
        if t in offsets_at:
            env.sim.x[:, 0] = torch.tensor(offsets_at[t])
        _, _, terminated, truncated, info = env.step(action)
    assert bool(truncated.all()) and not bool(terminated.any())
    return info


def test_success_needs_the_final_two_seconds_inside_radius():
    env = hovering_env(4)
    # env 0 stays at the origin; env 1 sits at 0.05 m throughout; env 2 is outside (0.15 m) during
    # episode step 300 only -> inside for exactly the last 200 steps = 2 s; env 3 is outside during
    # episode step 301 only -> inside for the last 199 steps
    offsets = {0: [0.0, 0.05, 0.0, 0.0], 299: [0.0, 0.05, 0.15, 0.0], 300: [0.0, 0.05, 0.05, 0.15],
               301: [0.0, 0.05, 0.05, 0.05]}
    info = run_to_end(env, offsets)
    assert info["final_info"]["success"].tolist() == [1.0, 1.0, 1.0, 0.0]


def test_termination_beyond_radius_and_no_success():
    env = hovering_env(2)
    env.sim.x[1, 0] = 0.61  # [m] beyond the 0.6 m termination radius
    _, reward, terminated, truncated, info = env.step(torch.full((2, 4), HOVER))
    assert terminated.tolist() == [False, True] and not bool(truncated.any())
    assert info["final_info"]["success"][1] == 0.0
    assert torch.allclose(info["final_obs"]["policy"][1, :3], torch.tensor([0.61, 0.0, 0.0]), atol=1e-3)


def test_reward_terms_at_hover_equal_the_constant():
    env = hovering_env(3)
    _, reward, *_ , info = env.step(torch.full((3, 4), HOVER))
    # r = 2 - 0.5 (5 |p|^2 + 5 (1 - qw^2) + 0.01 |v|^2 + 0.01 |a - a_hover|^2) = 2 at rest at the set-point
    torch.testing.assert_close(reward, torch.full((3,), 2.0), atol=1e-5, rtol=0)
    env.sim.x[0, 0:3] = torch.tensor([0.1, 0.2, 0.0])
    _, reward, *_ = env.step(torch.full((3, 4), HOVER))
    # |p|^2 = 0.05, plus the default |p| term (weight 10)
    assert reward[0].item() == pytest.approx(2 - 0.5 * 5 * 0.05 - 0.5 * 10 * math.sqrt(0.05), abs=2e-4)


def test_position_abs_term():
    env = hovering_env(1, reward={"position_abs": 4.0})
    env.sim.x[0, 0:3] = torch.tensor([0.1, 0.2, 0.0])
    _, reward, *_, info = env.step(torch.full((1, 4), HOVER))
    # r = 2 - 0.5 (5 |p|^2 + 4 |p|), |p| = sqrt(0.05)
    assert reward[0].item() == pytest.approx(2 - 0.5 * (5 * 0.05 + 4 * math.sqrt(0.05)), abs=3e-4)
    assert float(info["log"]["reward/position_abs"]) == pytest.approx(-0.5 * 4 * math.sqrt(0.05), abs=2e-4)


@pytest.mark.parametrize("kernel", ["numba", "torch"])
def test_reward_floor(kernel):
    """reward.floor: a step's reward is lifted to the floor where the terms sum below it (the term ``floor`` =
    max(0, floor - sum)); above it nothing changes; without one (None, L2F's) the term is zero."""
    env = hovering_env(3, kernel=kernel, reward={"floor": 0.5})
    env.sim.x[0, 0:3] = torch.tensor([0.1, 0.2, 0.0])  # r = 2 - 0.5 (5 * 0.05 + 10 sqrt(0.05)) = 0.757 > 0.5
    env.sim.x[1, 0:3] = torch.tensor([0.5, 0.0, 0.0])  # r = 2 - 0.5 (5 * 0.25 + 10 * 0.5) = -1.125: lifted to 0.5
    _, reward, terminated, _, info = env.step(torch.full((3, 4), HOVER))
    assert not bool(terminated.any())
    assert reward[0].item() == pytest.approx(2 - 0.5 * (5 * 0.05 + 10 * math.sqrt(0.05)), abs=3e-4)
    assert reward[1].item() == pytest.approx(0.5, abs=1e-6) and reward[2].item() == pytest.approx(2.0, abs=1e-5)
    lifted = 0.5 - (2 - 0.5 * (5 * 0.25 + 10 * 0.5))
    assert float(info["log"]["reward/floor"]) == pytest.approx(lifted / 3, abs=3e-4)
    plain = hovering_env(1, kernel=kernel, reward={"floor": None})  # L2F's: no floor
    plain.sim.x[0, 0] = 0.5
    _, reward, *_, info = plain.step(torch.full((1, 4), HOVER))
    assert reward[0].item() == pytest.approx(-1.125, abs=3e-4) and info["log"]["reward/floor"] == 0.0


def test_observation_layout_and_action_history():
    env = hovering_env(2, action_history=32)
    a1, a2 = torch.full((2, 4), 0.1), torch.full((2, 4), -0.2)
    env.step(a1)
    obs, *_ = env.step(a2)
    assert obs["policy"].shape == (2, 18 + 128 + 3) and obs["critic"].shape == (2, 28)
    rot = obs["policy"][0, 3:12].reshape(3, 3)
    torch.testing.assert_close(rot, torch.eye(3), atol=1e-4, rtol=0)  # level
    hist = obs["policy"][0, 18:146].reshape(32, 4)
    assert torch.equal(hist[-1], a2[0]) and torch.equal(hist[-2], a1[0]) and bool((hist[:-2] == 0).all())
    # critic: true rotor speeds normalized to [-1, 1] in its last 4 entries
    rpm = env.sim.rpm[0] * 2 / QuadrotorParams().rpm_max - 1
    torch.testing.assert_close(obs["critic"][0, 24:], rpm)


def test_initial_state_distribution():
    env = embodied.make_env("quadrotor-hover", num_envs=4000, seed=1)
    env.reset()
    x = env.sim.x
    assert x[:, :3].abs().max() <= 0.2 and x[:, 7:10].abs().max() <= 1.0 and x[:, 10:13].abs().max() <= 1.0
    angle = 2 * torch.acos(x[:, 3].clamp(-1, 1))
    assert angle.max() <= math.pi / 2 + 1e-5 and angle.max() > 1.4  # up to 90 degrees
    at_setpoint = (x[:, :13].abs().sum(1) - 1).abs() < 1e-6  # guidance: level at rest at the origin
    assert 0.07 < at_setpoint.float().mean() < 0.13  # 10%


def test_domain_randomization_ranges_and_log():
    env = embodied.make_env("quadrotor-hover", num_envs=2000, seed=2, domain_randomization={"enabled": True})
    env.reset()
    nominal = QuadrotorParams()
    mass = env.sim.p[:, 0] / nominal.mass
    tau = env.sim.p[:, 6] / nominal.motor_tau
    inertia = env.sim.p[:, 1] / nominal.inertia[0]
    assert 0.75 <= mass.min() < 0.77 and 1.23 < mass.max() <= 1.25  # the defaults: +-25% mass
    assert 0.65 <= tau.min() < 0.67 and 1.33 < tau.max() <= 1.35  # +-35% motor lag
    assert 0.8 <= inertia.min() < 0.85 and 2.9 < inertia.max() <= 3.0  # up to the l2f set's 2.9x
    assert 0.5 <= env.noise_scale.min() < 0.55 and 2.45 < env.noise_scale.max() <= 2.5  # noise x0.5-2.5
    # the critic sees the sampled plant as log factors (mass, inertia, k_f, k_m, motor lag, noise)
    obs, _ = env.reset(seed=2)
    assert obs["critic"].shape[1] == 28 + 6
    torch.testing.assert_close(obs["critic"][:, 28], (env.sim.p[:, 0] / nominal.mass).log(), rtol=0, atol=1e-6)
    torch.testing.assert_close(obs["critic"][:, 33], env.noise_scale.log(), rtol=0, atol=1e-6)
    # disturbance force std = m g / 20 per axis
    std = (env.sim.p[:, 7:10] / (env.sim.p[:, :1] * GRAVITY)).std()
    assert std.item() == pytest.approx(0.05, rel=0.1)
    *_, info = env.step(torch.zeros(2000, 4))
    assert {"dr/mass", "dr/obs_noise"} <= set(info["log"])
    with pytest.raises(UserError, match="domain_randomization.mass"):
        embodied.make_env("quadrotor-hover", domain_randomization={"enabled": True, "mass": [1.2, 0.8]})
    off = embodied.make_env("quadrotor-hover", num_envs=8, seed=2)
    off.reset()
    assert bool((off.sim.p[:, 0] == nominal.mass).all())


def test_curriculum_steps_weights():
    env = embodied.make_env("quadrotor-hover", num_envs=10, curriculum={"interval": 50})
    env.reset()
    for _ in range(5):  # 50 env steps -> one curriculum step
        env.step(torch.zeros(10, 4))
    w = env.weights
    assert w.position == pytest.approx(5 * 1.2) and w.lin_vel == pytest.approx(0.014)
    assert w.action == pytest.approx(0.014)
    for _ in range(500):
        env.step(torch.zeros(10, 4))
    assert w.position == pytest.approx(5 * 1.2**101 if 5 * 1.2**101 < 40 else 40.0)
    assert env.weights.lin_vel == 1.0 and env.weights.action == 1.0  # capped


@pytest.mark.parametrize("average_s", [0.0, 0.5])
def test_mirror_group_is_a_symmetry_of_the_dynamics_reward_and_observations(average_s):
    """Each declared mirror g maps a trajectory onto a trajectory: stepping g x with g u gives g of
    the next observation (both groups, exact up to float error) and the same reward; with a position average in
    the observation too (it mirrors as the position does)."""
    from embodied.tasks.quadrotor.hover import MIRRORS

    env = embodied.make_env("quadrotor-hover", num_envs=4, obs_noise_position=0.0, obs_noise_orientation=0.0,
                            obs_noise_lin_vel=0.0, obs_noise_ang_vel=0.0, kernel="torch", position_average_s=average_s)
    group = env.symmetry_group()
    assert group.size == len(MIRRORS) == 4
    env.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(17, generator=gen) * 0.1  # well inside the termination radius
    x0[3:7] = torch.nn.functional.normalize(torch.randn(4, generator=gen), dim=0)
    x0[13:17] = torch.rand(4, generator=gen) * 21702
    p0 = env.sim.p[0].clone()
    p0[7:13] = torch.randn(6, generator=gen) * 1e-2
    hist0 = torch.rand(env.actions.shape[1], generator=gen) * 2 - 1
    u0 = torch.rand(1, 4, generator=gen) * 2 - 1
    avg0 = torch.randn(3, generator=gen) * 0.1
    xs, ps, hs, us, avgs = [], [], [], [], []
    for m, perm in MIRRORS:
        m = torch.tensor(m)
        det = m.prod()
        x = x0.clone()
        x[0:3], x[7:10] = m * x0[0:3], m * x0[7:10]
        x[4:7] = det * m * x0[4:7]  # quaternion vector part: axial
        x[10:13] = det * m * x0[10:13]
        x[13:17] = x0[13:17][list(perm)]
        p = p0.clone()
        p[7:10], p[10:13] = m * p0[7:10], det * m * p0[10:13]
        xs.append(x), ps.append(p), hs.append(hist0.reshape(-1, 4)[:, list(perm)].reshape(-1))
        us.append(u0[0, list(perm)])
        avgs.append(m * avg0)
    ids = torch.arange(4)
    env.sim.set_state_idx(ids, torch.stack(xs))
    env.sim.set_params_idx(ids, torch.stack(ps))
    env.actions[:] = torch.stack(hs)
    if average_s:
        env.pos_average[:] = torch.stack(avgs)
    obs, reward, *_ = env.step(torch.stack(us))
    for g in range(4):
        for key in ("policy", "critic"):
            want = group.apply(key, obs[key][:1], g)
            torch.testing.assert_close(obs[key][g:g + 1], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(reward[g], reward[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(group.apply("action", u0, g), us[g][None])
