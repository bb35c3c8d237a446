"""The fused numba step of quadrotor-hover (kernels/quadrotor_numba.py) against the torch reference
(``kernel=torch``): every reward term, termination, truncation, success, final observation, the log, the
physics state, fault recovery, the reset distribution and the random stream's known values."""

import math

import numpy as np
import pytest
import torch

import embodied
from embodied.core.errors import UserError
from embodied.kernels.quadrotor import numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

NO_NOISE = dict(obs_noise_position=0.0, obs_noise_orientation=0.0, obs_noise_lin_vel=0.0, obs_noise_ang_vel=0.0)


def pair(n, device="cpu", **kw):
    """The fused env (CPU) and the torch reference on ``device``."""
    fused = embodied.make_env("quadrotor-hover", num_envs=n, seed=1, **kw)
    ref = embodied.make_env("quadrotor-hover", num_envs=n, seed=1, kernel="torch", device=device, **kw)
    assert fused._fused is not None and ref._fused is None
    fused.reset(seed=3)
    ref.reset(seed=3)
    return fused, ref


def on_cpu(tree):
    """A step's outputs (tensors in tuples and dicts) on the CPU."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: on_cpu(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(on_cpu(v) for v in tree)
    return tree


def sync(ref, fused):
    """Copy the fused env's state into the reference, so one step of each starts from the same state."""
    ref.sim.x.copy_(fused.sim.x)
    ref.sim.p.copy_(fused.sim.p)
    ref.actions.copy_(fused.actions)
    ref.episode_length.copy_(fused.episode_length)
    ref.last_outside.copy_(fused.last_outside)
    ref.noise_scale.copy_(fused.noise_scale)
    ref.pos_average.copy_(fused.pos_average)


AVERAGED = {"position_average_s": 0.05, "termination_radius": 0.5}  # the position average in the actor observation
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("kw, device", [
    ({"termination_radius": 1e3}, "cpu"),  # episodes end by the time limit
    ({"domain_randomization": {"enabled": True}, "reward": {"termination_penalty": 3.0}, "termination_radius": 0.4},
     "cpu"),
    (AVERAGED, "cpu"),
    ({"reward": {"floor": 0.0}, "termination_radius": 0.5}, "cpu"),  # the floor lifts the far envs' rewards
    pytest.param(AVERAGED, "cuda", marks=CUDA),  # the torch path on CUDA: the whole task step, not only physics
])
def test_fused_step_matches_the_torch_reference(kw, device):
    """600 steps (more than one episode) of random actions, state re-synchronized before each step:
    everything the step returns agrees, to float32 round-off (the RK4 sums in another order: 1e-5 on
    states; rewards to 1e-5 relative)."""
    n = 48
    fused, ref = pair(n, device, **NO_NOISE, **kw)
    g = torch.Generator().manual_seed(0)
    ends = terminations = lifted = 0
    for _ in range(600):
        sync(ref, fused)
        action = torch.rand(n, 4, generator=g) * 2.4 - 1.2  # also outside [-1, 1]: clipped by both
        of, rf, tf, uf, inf = fused.step(action)
        x_fused = fused.sim.x.clone()
        orf, rr, tr, ur, inr = on_cpu(ref.step(action.to(ref.device)))
        assert torch.equal(tf, tr) and torch.equal(uf, ur)
        torch.testing.assert_close(rf, rr, rtol=1e-5, atol=2e-6)
        done = tr | ur
        for k in ("policy", "critic"):
            torch.testing.assert_close(inf["final_obs"][k], inr["final_obs"][k], rtol=1e-4, atol=1e-5)
        assert set(inf["log"]) == set(inr["log"])
        lifted += inr["log"]["reward/floor"] > 0
        for k, v in inr["log"].items():
            assert inf["log"][k] == pytest.approx(float(v), rel=1e-5, abs=1e-6), k
        if done.any():
            assert torch.equal(inf["final_info"]["success"][done], inr["final_info"]["success"][done])
            ends += int(done.sum())
            terminations += int(tr.sum())
        live = ~done  # envs that were not reset hold the same state and observation
        torch.testing.assert_close(x_fused[live], ref.sim.x.cpu()[live], rtol=1e-4, atol=1e-5)
        for k in ("policy", "critic"):
            torch.testing.assert_close(of[k][live], orf[k][live], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fused.pos_average[live], ref.pos_average.cpu()[live], rtol=1e-4, atol=1e-6)
    assert ends > 0 and (terminations > 0) == (kw.get("termination_radius") in (0.4, 0.5))
    if "reward" in kw and "floor" in kw["reward"]:
        assert lifted > 0


@pytest.mark.parametrize("kernel", ["numba", "torch"])
def test_position_average_exact_values(kernel):
    """``position_average_s``: the actor observation ends with the average of the observed position: at an
    episode's first observation that position, then ``d * avg + (1 - d) * pos`` every step, with
    ``d = exp(-dt / tau)`` rounded to float32 (0.99004983901977539 for tau = 1 s at 100 Hz), across an episode end
    (its final observation advanced, the next episode's restarted); the layout declares it as an average of
    ``pos_w``, which the deploy runner keeps the same way."""
    env = embodied.make_env("quadrotor-hover", num_envs=5, seed=0, kernel=kernel, position_average_s=1.0,
                            termination_radius=100.0, episode_s=0.05, obs_noise_position=0.01)
    d = np.float32(0.99004983901977539)
    assert env.position_decay == float(d) == float(np.float32(math.exp(-0.01)))
    (term,) = [t for t in env.layout().terms("policy") if t.source == "average"]
    assert (term.name, term.average_of, term.average_decay) == ("pos_w_average", "pos_w", float(d))
    assert env.layout().slices("policy")["pos_w_average"] == slice(18 + 64, 18 + 64 + 3)
    obs, _ = env.reset(seed=2)
    assert obs["policy"].shape == (5, 18 + 64 + 3) and torch.equal(obs["policy"][:, -3:], obs["policy"][:, :3])
    avg = obs["policy"][:, :3].numpy().copy()
    g = torch.Generator().manual_seed(0)
    for t in range(1, 8):
        obs, _, _, truncated, info = env.step(torch.rand(5, 4, generator=g) * 2 - 1)
        last = info["final_obs"]["policy"]
        avg = d * avg + (np.float32(1.0) - d) * last[:, :3].numpy()
        np.testing.assert_allclose(last[:, -3:].numpy(), avg, rtol=0, atol=2e-8)
        assert bool(truncated.all()) == (t == 5)
        if t == 5:  # the new episode's average starts at its first observed position
            assert np.abs(avg - last[:, :3].numpy()).max() > 1e-3  # the average lagged the position
            assert torch.equal(obs["policy"][:, -3:], obs["policy"][:, :3])
            avg = obs["policy"][:, :3].numpy().copy()
        np.testing.assert_array_equal(env.pos_average.numpy(), obs["policy"][:, -3:].numpy())


def test_success_and_reward_terms_at_hover():
    env = embodied.make_env("quadrotor-hover", num_envs=2, seed=0, disturbance_force=0.0, disturbance_torque=0.0,
                            **NO_NOISE)
    env.reset(seed=0)
    x = torch.zeros(2, 17)
    x[:, 3] = 1.0
    x[:, 13:] = env.params.hover_rpm
    x[1, 0] = 0.05  # inside the success radius
    env.sim.set_state_idx(torch.arange(2), x)
    hover = torch.full((2, 4), env.hover_action)
    for _ in range(env.max_episode_steps):
        _, reward, terminated, truncated, info = env.step(hover)
    assert truncated.all() and not terminated.any()
    assert info["final_info"]["success"].tolist() == [1.0, 1.0]
    assert info["log"]["reward/constant"] == 2.0
    # env 1 keeps 0.05 m off: position terms 0.5 (5 * 0.05^2 + 10 * 0.05) / 2 envs on average
    assert info["log"]["reward/position"] == pytest.approx(-0.5 * 5 * 0.05 ** 2 / 2, rel=2e-3)
    assert info["log"]["reward/position_abs"] == pytest.approx(-0.5 * 10 * 0.05 / 2, rel=2e-3)


def test_numerical_fault_is_counted_truncated_and_reset():
    env = embodied.make_env("quadrotor-hover", num_envs=3, seed=0)
    env.reset(seed=0)
    env.sim.x[1, 7] = float("nan")
    obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 4))
    assert env.num_nan_resets == 1 and info["log"]["nan_resets"] == 1.0
    assert truncated.tolist() == [False, True, False] and not terminated[1]
    assert reward[1] == 0.0 and torch.isfinite(reward).all()
    assert all(torch.isfinite(v).all() for v in info["final_obs"].values())
    assert torch.isfinite(env.sim.x).all() and env.episode_length[1] == 0
    assert all(torch.isfinite(v).all() for v in obs.values())


def test_observation_layout_noise_and_action_history():
    h = 16
    env = embodied.make_env("quadrotor-hover", num_envs=4000, seed=0, obs_noise_position=0.01,
                            obs_noise_orientation=0.02, obs_noise_lin_vel=0.03, obs_noise_ang_vel=0.04,
                            termination_radius=100.0)
    env.reset(seed=0)
    actions = [torch.full((4000, 4), v) for v in (-0.5, 0.1, 0.2, 0.3)]
    for a in actions:
        obs, *_ = env.step(a)
    pol, cri = obs["policy"], obs["critic"]
    assert pol.shape == (4000, 18 + 4 * h + 3) and cri.shape == (4000, 28)
    hist = pol[:, 18:18 + 4 * h].reshape(4000, h, 4)
    assert torch.equal(hist[:, :-4], torch.zeros(4000, h - 4, 4))  # oldest first, zero before the first step
    for k, a in enumerate(actions):
        assert torch.equal(hist[:, h - 4 + k], a)
    noise = pol[:, :18] - cri[:, :18]
    for sl, std in ((slice(0, 3), 0.01), (slice(3, 12), 0.02), (slice(12, 15), 0.03), (slice(15, 18), 0.04)):
        assert noise[:, sl].std().item() == pytest.approx(std, rel=0.03)
        assert abs(noise[:, sl].mean().item()) < 3 * std / math.sqrt(noise[:, sl].numel())
    # the critic's clean part: position, row-major rotation matrix of the state's quaternion, velocities
    from embodied.core.rotations import quat_to_rotmat
    x = env.sim.x
    torch.testing.assert_close(cri[:, 0:3], x[:, 0:3])
    torch.testing.assert_close(cri[:, 3:12], quat_to_rotmat(x[:, 3:7]).reshape(-1, 9), rtol=0, atol=1e-6)
    torch.testing.assert_close(cri[:, 12:18], x[:, 7:13])
    mg = env.sim.mass * 9.81
    torch.testing.assert_close(cri[:, 18:21], env.sim.force_w / mg)
    torch.testing.assert_close(cri[:, 24:28], x[:, 13:17] * (2 / env.params.rpm_max) - 1)


def _initial_states(kernel, n=40000, **kw):
    env = embodied.make_env("quadrotor-hover", num_envs=n, seed=7, kernel=kernel, **kw)
    env.reset(seed=7)
    return env.sim.x.clone(), env.sim.p.clone(), env.nominal_p[0], env.noise_scale.clone()


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_reset_distribution(kernel):
    """Both paths sample the documented initial-state distribution (moments of the uniform ranges, the
    rotation angle, guided starts, domain randomization factors, disturbance std)."""
    dr = {"enabled": True, "mass": [0.75, 1.25], "thrust_constant": [0.85, 1.15], "motor_time_constant": [0.65, 1.35],
          "inertia": [0.8, 3.0], "torque_constant": [0.9, 1.1], "obs_noise": [0.5, 2.5],
          "hard_share": 0.0}
    x, p, nominal, noise_scale = _initial_states(kernel, domain_randomization=dr)
    n = x.shape[0]
    guided = (x[:, :13].abs().sum(1) == 1.0) & (x[:, 3] == 1.0)
    assert guided.float().mean().item() == pytest.approx(0.1, abs=0.006)
    free = x[~guided]
    se = 3.5 / math.sqrt(free.shape[0])
    for sl, half in ((slice(0, 3), 0.2), (slice(7, 10), 1.0), (slice(10, 13), 1.0)):
        v = free[:, sl] / half  # U(-1, 1): mean 0, var 1/3, |v| <= 1
        assert v.abs().max() <= 1.0
        assert abs(v.mean().item()) < se and v.var().item() == pytest.approx(1 / 3, abs=0.01)
    angle = 2 * torch.acos(free[:, 3].clamp(-1, 1))  # U(0, pi/2)
    assert angle.max() <= math.pi / 2 + 1e-5 and angle.mean().item() == pytest.approx(math.pi / 4, abs=0.01)
    torch.testing.assert_close(free[:, 3:7].norm(dim=1), torch.ones(free.shape[0]))
    axis = free[:, 4:7] / free[:, 4:7].norm(dim=1, keepdim=True)
    assert axis.mean(0).abs().max() < 0.02 and axis.pow(2).mean(0).sub(1 / 3).abs().max() < 0.01  # isotropic
    assert torch.equal(x[:, 13:], torch.full((n, 4), 0.5 * 21702.0))
    factors = [p[:, col] / nominal[col] for col in (0, 1, 4, 5, 6)] + [noise_scale]
    for f, key in zip(factors, ("mass", "inertia", "thrust_constant", "torque_constant", "motor_time_constant",
                                "obs_noise")):
        lo, hi = dr[key]  # U(lo, hi)
        assert f.min() >= lo - 1e-6 and f.max() <= hi + 1e-6
        assert f.mean().item() == pytest.approx((lo + hi) / 2, abs=0.005 * (hi - lo) + 1e-4)
        assert f.std().item() == pytest.approx((hi - lo) / math.sqrt(12), rel=0.03)
    torch.testing.assert_close(p[:, 2] / nominal[2], p[:, 1] / nominal[1])  # inertia entries share a factor
    force = p[:, 7:10] / (p[:, 0:1] * 9.81)
    assert force.std().item() == pytest.approx(1 / 20, rel=0.03) and force.mean().abs().item() < 0.002


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_hard_plants_share(kernel):
    """domain_randomization.hard_share: that share of plants has its mass factor from the top third of the range and
    its thrust constant's from the bottom third, uniform there; the others (and the other factors) stay uniform over
    the whole ranges; evaluation draws from the whole ranges. ``hard_factors`` picks other factors' hard thirds."""
    share, (m_lo, m_hi), (k_lo, k_hi) = 0.3, (0.75, 1.25), (0.85, 1.15)
    dr = {"enabled": True, "hard_share": share, "hard_factors": ["mass", "thrust_constant"]}
    _, p, nominal, _ = _initial_states(kernel, domain_randomization=dr)
    mass = (p[:, 0] / nominal[0] - m_lo) / (m_hi - m_lo)  # U(0, 1) positions in the ranges
    k_f = (p[:, 4] / nominal[4] - k_lo) / (k_hi - k_lo)
    corner = (mass >= 2 / 3) & (k_f <= 1 / 3)
    se = 4 / math.sqrt(p.shape[0])
    # P(corner) = share + (1 - share) / 9; P(mass in its top third) = share + (1 - share) / 3
    assert corner.float().mean().item() == pytest.approx(share + (1 - share) / 9, abs=se)
    assert (mass >= 2 / 3).float().mean().item() == pytest.approx(share + (1 - share) / 3, abs=se)
    assert (k_f <= 1 / 3).float().mean().item() == pytest.approx(share + (1 - share) / 3, abs=se)
    assert mass.min() >= -1e-6 and mass.max() <= 1 + 1e-6 and k_f.min() >= -1e-6 and k_f.max() <= 1 + 1e-6
    inside = mass[corner]  # the corner's draws: uniform over the top third (those of the uniform plants too)
    assert inside.mean().item() == pytest.approx(5 / 6, abs=0.003)
    tau = p[:, 6] / nominal[6]  # untouched: U(0.65, 1.35)
    assert tau.mean().item() == pytest.approx(1.0, abs=0.005) and tau.std().item() == pytest.approx(0.7 / 12 ** 0.5,
                                                                                                     rel=0.03)
    _, p_all, nominal, _ = _initial_states(kernel, domain_randomization={"enabled": True, "hard_share": 1.0})
    assert (p_all[:, 0] / nominal[0]).min() >= m_lo + (m_hi - m_lo) * 2 / 3 - 1e-6
    assert (p_all[:, 4] / nominal[4]).max() <= k_lo + (k_hi - k_lo) / 3 + 1e-6
    env = embodied.make_env("quadrotor-hover", num_envs=4, domain_randomization={"enabled": True})
    assert env.hard_thirds == {"mass": 2.0, "inertia": 2.0, "k_f": 0.0, "motor_tau": 2.0}  # the default hard factors
    assert embodied.tasks.quadrotor.hover.strict_eval_config(env.cfg).domain_randomization.hard_share == 0.0
    # hard_factors: other factors from their hard thirds (inertia and motor lag top, torque constant bottom), the mass
    # and thrust constant then uniform
    dr = {"enabled": True, "hard_share": share,
          "hard_factors": ["inertia", "torque_constant", "motor_time_constant"]}
    _, p, nominal, _ = _initial_states(kernel, domain_randomization=dr)
    pos = {col: (p[:, col] / nominal[col] - lo) / (hi - lo)  # U(0, 1) positions in the ranges
           for col, (lo, hi) in ((0, (0.75, 1.25)), (1, (0.8, 3.0)), (4, (0.85, 1.15)), (5, (0.75, 1.25)),
                                 (6, (0.65, 1.35)))}
    corner = (pos[1] >= 2 / 3) & (pos[5] <= 1 / 3) & (pos[6] >= 2 / 3)
    assert corner.float().mean().item() == pytest.approx(share + (1 - share) / 27, abs=se)
    for col in (1, 6):
        assert (pos[col] >= 2 / 3).float().mean().item() == pytest.approx(share + (1 - share) / 3, abs=se)
    assert (pos[5] <= 1 / 3).float().mean().item() == pytest.approx(share + (1 - share) / 3, abs=se)
    for col in (0, 4):
        assert (pos[col] >= 2 / 3).float().mean().item() == pytest.approx(1 / 3, abs=se)
        assert (pos[col] <= 1 / 3).float().mean().item() == pytest.approx(1 / 3, abs=se)
    with pytest.raises(UserError, match="hard_factors: obs_noise not among mass, inertia"):
        embodied.make_env("quadrotor-hover", num_envs=4, kernel=kernel,
                          domain_randomization={"enabled": True, "hard_factors": ["mass", "obs_noise"]})


def test_fused_checkpoint_restores_the_random_stream():
    a = embodied.make_env("quadrotor-hover", num_envs=8, seed=0)
    a.reset(seed=0)
    for _ in range(30):
        a.step(torch.zeros(8, 4))
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.state_dict().items()}
    b = embodied.make_env("quadrotor-hover", num_envs=8, seed=5)
    b.reset()
    b.load_state_dict(state)
    for _ in range(600):  # through a reset: the same initial states and noise
        oa, ra, *_ = a.step(torch.zeros(8, 4))
        ob, rb, *_ = b.step(torch.zeros(8, 4))
        assert torch.equal(oa["policy"], ob["policy"]) and torch.equal(ra, rb)


def test_splitmix64_and_normals():
    """Known splitmix64 outputs (seed 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f) and the
    moments of the polar-method normals and the independence of a pair's two."""
    from embodied.kernels import quadrotor_numba as fk

    rng = np.zeros(1, np.uint64)
    assert [int(fk._next(rng)) for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    rng[0] = 1
    z = np.array([fk.normal_pair(rng) for _ in range(100_000)]).ravel()
    assert abs(z.mean()) < 0.015 and z.var() == pytest.approx(1.0, abs=0.015)
    assert np.mean(z ** 4) == pytest.approx(3.0, abs=0.08)  # Gaussian kurtosis
    assert np.mean(np.abs(z) > 3) == pytest.approx(0.0027, abs=0.0007)  # the tails are there
    # exact values: the polar method on the stream's draws by hand (float32), outside-the-disc draws skipped
    draws, expected, used = np.array([1], np.uint64), [], 0
    while len(expected) < 8:
        d, used = int(fk._next(draws)), used + 1
        u = np.float32(d >> 40) * np.float32(2.0 / 16777216.0) - np.float32(1.0)
        v = np.float32((d >> 8) & 0xFFFFFF) * np.float32(2.0 / 16777216.0) - np.float32(1.0)
        s = np.float32(u * u + v * v)
        if 0 < s < 1:
            f = np.sqrt(np.float32(-2.0) * np.log(s) / s)
            expected.append((u * f, v * f))
    assert used == 10  # two draws fell outside the disc and were redrawn
    rng[0] = 1
    np.testing.assert_allclose([fk.normal_pair(rng) for _ in range(8)], expected, rtol=1e-6, atol=1e-7)
    pairs = z.reshape(-1, 2)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 0.015
    assert abs(np.corrcoef(pairs[:, 0] ** 2, pairs[:, 1] ** 2)[0, 1]) < 0.015  # not just uncorrelated: independent


def test_weight_changes_reach_the_kernel_and_bad_history_is_refused():
    env = embodied.make_env("quadrotor-hover", num_envs=1, seed=0, **NO_NOISE)
    env.reset(seed=-1)  # a negative seed wraps, as torch's generator does
    env.sim.x[0, 0:3] = torch.tensor([0.1, 0.0, 0.0])
    env.weights.position_abs = 0.0  # as a user (or the curriculum) changes a weight between steps
    *_, info = env.step(torch.zeros(1, 4))
    assert info["log"]["reward/position_abs"] == 0.0
    from embodied.core.errors import UserError

    with pytest.raises(UserError, match="action_history"):
        embodied.make_env("quadrotor-hover", action_history=0)
