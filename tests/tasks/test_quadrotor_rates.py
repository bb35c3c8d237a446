"""quadrotor-hover-rates: the rate controller and mixer (exact values), the mirror group as a symmetry of the
dynamics with (thrust, body-rate) actions, and the layout."""

from __future__ import annotations

import pytest
import torch

import embodied
from embodied.kernels.quadrotor import GRAVITY, ROTOR_DIR, ROTOR_X, ROTOR_Y
from embodied.tasks.quadrotor.hover import MIRRORS
from embodied.tasks.quadrotor.rates import mixer_inverse


def test_mixer_inverts_the_x_allocation():
    km = 0.006
    a = torch.stack([torch.ones(4), torch.tensor(ROTOR_Y), -torch.tensor(ROTOR_X), km * torch.tensor(ROTOR_DIR)])
    torch.testing.assert_close(mixer_inverse(km) @ a, torch.eye(4), atol=1e-5, rtol=0)


def test_rate_controller_values():
    env = embodied.make_env("quadrotor-hover-rates", num_envs=3, motor_inversion=False)
    env.reset(seed=0)
    env.sim.ang_vel_b[:] = 0.0
    hover = env.hover_action.expand(3, 4).clone()
    rpm = env.rotor_speeds(hover)
    f = env.kf_nom * rpm * rpm
    mass = float(env.sim.PARAMS.view(env.nominal_p, "mass")[0, 0])
    torch.testing.assert_close(f.sum(1), torch.full((3,), mass * GRAVITY), rtol=1e-5, atol=0)  # hover thrust
    torch.testing.assert_close(f, f[:, :1].expand(3, 4))  # level, no rate error: equal rotors
    cmd = hover.clone()
    cmd[0, 1], cmd[1, 2], cmd[2, 3] = 0.1, 0.1, 0.1  # +roll, +pitch, +yaw rate requests
    f = env.kf_nom * env.rotor_speeds(cmd) ** 2
    tau = torch.stack([(torch.tensor(ROTOR_Y) * f).sum(1), -(torch.tensor(ROTOR_X) * f).sum(1),
                       (torch.tensor(ROTOR_DIR) * f).sum(1)], 1)
    j = env.j_nom
    k_rp, k_y = env.cfg.rate_gain_rp, env.cfg.rate_gain_yaw
    want = torch.stack([j[0] * k_rp * 0.6, j[1] * k_rp * 0.6, j[2] * k_y * 0.3])  # J K (a max_rate)
    torch.testing.assert_close(tau[0, 0], want[0], rtol=1e-4, atol=0)
    torch.testing.assert_close(tau[1, 1], want[1], rtol=1e-4, atol=0)
    assert tau[2, 2] > 0 and abs(float(tau[0, 1])) < 1e-9 and f.sum(1).allclose(torch.full((3,), mass * GRAVITY))


def test_motor_lag_inversion_reaches_the_desired_speed_in_one_step():
    env = embodied.make_env("quadrotor-hover-rates", num_envs=2, init_guidance=1.0, disturbance_force=0.0,
                            disturbance_torque=0.0)
    env.reset(seed=0)
    a = env.hover_action.expand(2, 4).clone()
    a[1, 1] = 0.05  # a small roll-rate request
    plain = embodied.make_env("quadrotor-hover-rates", num_envs=2, motor_inversion=False)
    plain.sim.ang_vel_b[:] = env.sim.ang_vel_b
    want = plain.rotor_speeds(a)
    env.sim.rpm[:] = 0.995 * want  # near the desired speeds: the command that reaches them is not clipped
    env.motor_estimate[:] = env.sim.rpm
    env.step(a)
    torch.testing.assert_close(env.sim.rpm, want, rtol=2e-3, atol=0)  # the plant's lagged motors got there
    torch.testing.assert_close(env.motor_estimate, want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("average_s", [0.0, 0.5])  # with hover's position average after the history too
def test_mirror_group_is_a_symmetry_of_the_rate_controlled_dynamics(average_s):
    env = embodied.make_env("quadrotor-hover-rates", num_envs=4, obs_noise_position=0.0, obs_noise_orientation=0.0,
                            obs_noise_lin_vel=0.0, obs_noise_ang_vel=0.0, position_average_s=average_s)
    group = env.symmetry_group()
    env.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(17, generator=gen) * 0.1
    x0[3:7] = torch.nn.functional.normalize(torch.randn(4, generator=gen), dim=0)
    x0[13:17] = torch.rand(4, generator=gen) * 21702
    p0 = env.sim.p[0].clone()
    p0[7:13] = torch.randn(6, generator=gen) * 1e-2
    u0 = torch.rand(1, 4, generator=gen) * 2 - 1
    hist0 = torch.rand(1, env.actions.shape[1], generator=gen) * 2 - 1
    xs, ps = [], []
    for m, perm in MIRRORS:
        m = torch.tensor(m)
        det = m.prod()
        x = x0.clone()
        x[0:3], x[7:10] = m * x0[0:3], m * x0[7:10]
        x[4:7], x[10:13] = det * m * x0[4:7], det * m * x0[10:13]
        x[13:17] = x0[13:17][list(perm)]
        p = p0.clone()
        p[7:10], p[10:13] = m * p0[7:10], det * m * p0[10:13]
        xs.append(x), ps.append(p)
    ids = torch.arange(4)
    env.sim.set_state_idx(ids, torch.stack(xs))
    env.sim.set_params_idx(ids, torch.stack(ps))
    h = env.cfg.action_history
    env.actions[:] = torch.cat([group.apply("action", hist0.reshape(h, 4), g).reshape(1, -1) for g in range(4)])
    if average_s:
        avg0 = torch.randn(3, generator=gen) * 0.1
        env.pos_average[:] = torch.stack([torch.tensor(m) * avg0 for m, _ in MIRRORS])
    obs, reward, *_ = env.step(torch.cat([group.apply("action", u0, g) for g in range(4)]))
    for g in range(4):
        for key in ("policy", "critic"):
            torch.testing.assert_close(obs[key][g:g + 1], group.apply(key, obs[key][:1], g), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(reward[g], reward[0], atol=1e-5, rtol=1e-5)


def test_layout_and_plant():
    env = embodied.make_env("quadrotor-hover-rates", num_envs=1)
    layout = env.layout()
    layout.check({g: s.shape for g, s in env.single_observation_space.spaces.items()}, env.single_action_space.shape)
    averaged = embodied.make_env("quadrotor-hover-rates", num_envs=1, position_average_s=1.0)
    names = [t.name for t in averaged.layout().terms("policy")]
    assert names[-2:] == ["action_history", "pos_w_average"] and "(thrust, rate)" in averaged.layout().terms(
        "policy")[-2].description
    averaged.layout().check({g: s.shape for g, s in averaged.single_observation_space.spaces.items()},
                            averaged.single_action_space.shape)
    assert [t.name for t in layout.action] == ["collective_thrust", "roll_pitch_rates", "yaw_rate"]
    assert layout.extras["hold_action"][0] == float(env.hover_action[0]) and layout.robot_size() == 18
    env.scale_plant(mass=1.1)
    assert "mass" in env.plant_parameters()
    # the hover task's reward floor is not this task's default (measured worse here)
    assert env.weights.floor is None and embodied.make_env("quadrotor-hover", num_envs=1).weights.floor == 0.0
