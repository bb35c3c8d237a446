"""Exact-value tests of the quadrotor RK4 step (``embodied.kernels.quadrotor``).

Hand computations use the Crazyflie 2.1 parameters of ``QuadrotorParams`` (learning-to-fly release,
../shared/reference/quadrotor.md 1.2). The physics tests run the torch reference in float64 so that
"exact" means float64 round-off; the numba kernel is then checked against the reference in float32.
"""

from __future__ import annotations

import math

import pytest
import torch

from embodied.core.rotations import quat_mul, quat_to_rotmat
from embodied.kernels import quadrotor as qk
from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams

P = QuadrotorParams()
DT = P.dt
G = qk.GRAVITY


def level_state(n: int, dtype=torch.float64, rpm: float = 0.0) -> torch.Tensor:
    """``[n, 17]`` at the origin, level, at rest, every rotor at ``rpm``."""
    x = torch.zeros(n, qk.STATE_DIM, dtype=dtype)
    x[:, 3] = 1.0
    x[:, 13:17] = rpm
    return x


def nominal_params(n: int, dtype=torch.float64) -> torch.Tensor:
    """``[n, 13]`` nominal parameters, zero disturbance."""
    return torch.tensor(P.as_row(), dtype=dtype).repeat(n, 1)


def random_batch(n: int, seed: int = 0, dtype=torch.float32):
    """Random but physical states, parameters with disturbances, and commands."""
    g = torch.Generator().manual_seed(seed)
    u01 = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64)
    x = torch.zeros(n, qk.STATE_DIM, dtype=torch.float64)
    x[:, 0:3] = (2 * u01(n, 3) - 1) * 1.0
    q = torch.randn(n, 4, generator=g, dtype=torch.float64)
    x[:, 3:7] = q / q.norm(dim=1, keepdim=True)
    x[:, 7:10] = (2 * u01(n, 3) - 1) * 2.0
    x[:, 10:13] = (2 * u01(n, 3) - 1) * 10.0
    x[:, 13:17] = u01(n, 4) * P.rpm_max
    p = nominal_params(n)
    mg = P.mass * G
    p[:, 7:10] = torch.randn(n, 3, generator=g, dtype=torch.float64) * mg / 20
    p[:, 10:13] = torch.randn(n, 3, generator=g, dtype=torch.float64) * mg / 1e4
    u = u01(n, 4) * P.rpm_max
    return x.to(dtype), p.to(dtype), u.to(dtype)


# ---- (a) free fall ------------------------------------------------------------------------------
@pytest.mark.parametrize("num_steps", [1, 7, 100])
def test_free_fall_is_exact(num_steps):
    """rpm = 0, command 0, no disturbance: constant acceleration -g e_z, which RK4 integrates
    exactly (the solution is a quadratic polynomial in t)."""
    x = level_state(3)
    x[:, 0:3] = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 10.0], [-0.5, 0.25, 3.0]], dtype=torch.float64)
    x0 = x.clone()
    p = nominal_params(3)
    u = torch.zeros(3, 4, dtype=torch.float64)
    for _ in range(num_steps):
        x = qk.rk4_step_torch(x, p, u, DT)
    t = num_steps * DT
    torch.testing.assert_close(x[:, 2], x0[:, 2] - 0.5 * G * t * t, rtol=0, atol=1e-12)
    torch.testing.assert_close(x[:, 9], torch.full((3,), -G * t, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(x[:, 0:2], x0[:, 0:2])  # x, y untouched
    assert torch.equal(x[:, 7:9], x0[:, 7:9])  # no horizontal velocity appears
    assert torch.equal(x[:, 3:7], x0[:, 3:7])  # attitude stays level
    assert torch.equal(x[:, 10:17], x0[:, 10:17])  # no spin, motors stay off


def test_ballistic_flight_with_initial_velocity():
    """Same with an initial velocity: p(t) = p0 + v0 t - g t^2/2 e_z, still exact under RK4."""
    x = level_state(1)
    v0 = torch.tensor([1.5, -0.75, 4.0], dtype=torch.float64)
    x[0, 7:10] = v0
    p = nominal_params(1)
    u = torch.zeros(1, 4, dtype=torch.float64)
    num_steps = 50
    for _ in range(num_steps):
        x = qk.rk4_step_torch(x, p, u, DT)
    t = num_steps * DT
    expected_pos = v0 * t + torch.tensor([0.0, 0.0, -0.5 * G * t * t], dtype=torch.float64)
    expected_vel = v0 + torch.tensor([0.0, 0.0, -G * t], dtype=torch.float64)
    torch.testing.assert_close(x[0, 0:3], expected_pos, rtol=0, atol=1e-12)
    torch.testing.assert_close(x[0, 7:10], expected_vel, rtol=0, atol=1e-12)


# ---- (b) hover equilibrium ----------------------------------------------------------------------
def test_hover_equilibrium():
    """Level, rpm = command = hover_rpm = sqrt(m g / (4 k_f)): 4 k_f rpm^2 = m g, so every
    derivative is zero and the state does not move."""
    hover = P.hover_rpm
    assert hover == pytest.approx(14_476, abs=0.5)  # reference 1.2: "hover RPM = 14,476"
    x = level_state(2, rpm=hover)
    x[1, 0:3] = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64)  # position is irrelevant
    p = nominal_params(2)
    u = torch.full((2, 4), hover, dtype=torch.float64)
    k = qk.derivative_torch(x, p, u)
    torch.testing.assert_close(k, torch.zeros_like(k), rtol=0, atol=1e-12)
    x0 = x.clone()
    for _ in range(100):
        x = qk.rk4_step_torch(x, p, u, DT)
    torch.testing.assert_close(x, x0, rtol=0, atol=1e-11)


# ---- (c) torques --------------------------------------------------------------------------------
def _derivative_at_rest(rpm: list[float]) -> torch.Tensor:
    x = level_state(1)
    x[0, 13:17] = torch.tensor(rpm, dtype=torch.float64)
    p = nominal_params(1)
    return qk.derivative_torch(x, p, x[:, 13:17].clone())[0]


def test_roll_torque_sign_and_value():
    """Rotors 2, 3 sit at y > 0 (ROTOR_Y); spinning them faster gives tau_x = sum y_i f_i > 0,
    i.e. the +y side lifts (right-hand rule about body x)."""
    assert qk.ROTOR_Y[2] > 0 and qk.ROTOR_Y[3] > 0 and qk.ROTOR_Y[0] < 0 and qk.ROTOR_Y[1] < 0
    lo, hi = 12_000.0, 16_000.0
    k = _derivative_at_rest([lo, lo, hi, hi])
    f_lo, f_hi = P.k_f * lo**2, P.k_f * hi**2
    tau_x = 0.028 * (2 * f_hi - 2 * f_lo)  # = 2.0224e-3 * ... [N m]
    assert k[10] > 0
    assert k[10].item() == pytest.approx(tau_x / P.inertia[0], rel=1e-12)
    assert k[10].item() == pytest.approx(0.028 * 2 * 3.16e-10 * (hi**2 - lo**2) / 3.85e-6, rel=1e-12)
    assert abs(k[11].item()) < 1e-9 and abs(k[12].item()) < 1e-9  # no pitch, no yaw
    # total thrust is along body z: (2 f_lo + 2 f_hi) / m - g
    assert k[9].item() == pytest.approx((2 * f_lo + 2 * f_hi) / P.mass - G, rel=1e-12)


def test_pitch_torque_sign_and_value():
    """Rotors 0, 3 sit at x > 0 (front); faster front rotors give tau_y = -sum x_i f_i < 0, which
    about body y turns the nose (+x) up."""
    lo, hi = 12_000.0, 16_000.0
    k = _derivative_at_rest([hi, lo, lo, hi])
    tau_y = -0.028 * (2 * P.k_f * hi**2 - 2 * P.k_f * lo**2)
    assert k[11] < 0
    assert k[11].item() == pytest.approx(tau_y / P.inertia[1], rel=1e-12)
    assert abs(k[10].item()) < 1e-9 and abs(k[12].item()) < 1e-9


def test_yaw_torque_sign_and_value():
    """ROTOR_DIR = (-1, +1, -1, +1): rotors 1, 3 faster gives tau_z = k_m sum dir_i f_i > 0. The
    pair (1, 3) is diagonal, so roll and pitch torques cancel."""
    assert qk.ROTOR_DIR == (-1.0, 1.0, -1.0, 1.0)
    lo, hi = 12_000.0, 16_000.0
    k = _derivative_at_rest([lo, hi, lo, hi])
    tau_z = P.k_m * (2 * P.k_f * hi**2 - 2 * P.k_f * lo**2)
    assert k[12] > 0
    assert k[12].item() == pytest.approx(tau_z / P.inertia[2], rel=1e-12)
    assert abs(k[10].item()) < 1e-9 and abs(k[11].item()) < 1e-9


def test_gyroscopic_term():
    """No thrust, w = (1, 0, 2) rad/s, J = diag(a, a, b): w x J w = (0, 2a - 2b, 0), so
    dw = (0, -(2a - 2b)/a, 0)."""
    x = level_state(1)
    x[0, 10:13] = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    p = nominal_params(1)
    k = qk.derivative_torch(x, p, torch.zeros(1, 4, dtype=torch.float64))[0]
    a, b = P.inertia[0], P.inertia[2]
    torch.testing.assert_close(
        k[10:13], torch.tensor([0.0, -(2 * a - 2 * b) / a, 0.0], dtype=torch.float64), rtol=1e-12, atol=1e-12
    )
    # identity attitude: dq = 0.5 (1, 0, 0, 0) (x) (0, w) = (0, w / 2)
    torch.testing.assert_close(k[3:7], torch.tensor([0.0, 0.5, 0.0, 1.0], dtype=torch.float64))


def test_derivative_matches_rotation_helpers():
    """On random states: dq = 0.5 q (x) (0, w), and acc = R(q) e_z T / m + F_d / m - g e_z."""
    x, p, u = random_batch(64, seed=3, dtype=torch.float64)
    k = qk.derivative_torch(x, p, u)
    q, w = x[:, 3:7], x[:, 10:13]
    torch.testing.assert_close(k[:, 3:7], 0.5 * quat_mul(q, torch.cat([torch.zeros_like(w[:, :1]), w], 1)))
    thrust = p[:, 4] * (x[:, 13:17] ** 2).sum(1)
    acc = quat_to_rotmat(q)[:, :, 2] * thrust[:, None] / p[:, :1] + p[:, 7:10] / p[:, :1]
    acc[:, 2] -= G
    torch.testing.assert_close(k[:, 7:10], acc)
    torch.testing.assert_close(k[:, 0:3], x[:, 7:10])


# ---- (d) motor lag ------------------------------------------------------------------------------
def test_motor_lag_rk4():
    """drpm/dt = (c - rpm) / T_m is linear, so one RK4 step multiplies (rpm - c) by the 4th-order
    Taylor polynomial of exp(z), z = -dt / T_m; that is exp(z) up to z^5 / 120 ~ 1e-8."""
    r0, c = 8_000.0, 20_000.0
    x = level_state(1, rpm=r0)
    p = nominal_params(1)
    u = torch.full((1, 4), c, dtype=torch.float64)
    rpm = qk.rk4_step_torch(x, p, u, DT)[0, 13:17]
    z = -DT / P.motor_tau
    taylor4 = 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24
    torch.testing.assert_close(rpm, torch.full((4,), c + (r0 - c) * taylor4, dtype=torch.float64), rtol=1e-14, atol=0)
    exact = c + (r0 - c) * math.exp(z)
    torch.testing.assert_close(rpm, torch.full((4,), exact, dtype=torch.float64), rtol=1e-6, atol=0)


# ---- (e) numba kernel vs torch reference --------------------------------------------------------
numba_only = pytest.mark.skipif(not qk.numba_available(), reason="numba is not installed")


@numba_only
@pytest.mark.parametrize("n", [1, 7, 1024])
def test_numba_matches_torch(n):
    x, p, u = random_batch(1024, seed=1)
    x, p, u = x[:n].contiguous(), p[:n].contiguous(), u[:n].contiguous()
    x_before = x.clone()
    expected = qk.rk4_step_torch(x, p, u, DT)
    assert torch.equal(x, x_before)  # the reference returns a new state
    out = x.clone()
    ret = qk.rk4_step_numba_(out, p, u, DT)
    assert ret is out  # in place
    # float32 with fastmath: tolerance relative to each state column's scale
    scale = expected.abs().amax(0).clamp_min(1.0)
    err = ((out - expected).abs() / scale).amax()
    assert err < 1e-5, f"max scaled error {err:.3g}"


@numba_only
def test_numba_matches_torch_over_many_steps():
    """100 steps at the hover command from random attitudes: the two do not drift apart."""
    x, p, _ = random_batch(256, seed=2)
    x[:, 10:13] *= 0.1
    u = torch.full((256, 4), P.hover_rpm, dtype=torch.float32)
    xt, xn = x.clone(), x.clone()
    for _ in range(100):
        xt = qk.rk4_step_torch(xt, p, u, DT)
        qk.rk4_step_numba_(xn, p, u, DT)
    torch.testing.assert_close(xn, xt, rtol=1e-3, atol=1e-3)


@numba_only
def test_numba_blow_up_gives_non_finite_not_error():
    x, p, u = random_batch(8, seed=4)
    x[3, 13:17] = 1e30  # rpm^2 overflows float32
    x[5, 10:13] = 1e30  # so does w x J w
    expected = qk.rk4_step_torch(x, p, u, DT)
    out = x.clone()
    qk.rk4_step_numba_(out, p, u, DT)
    assert not torch.isfinite(out[3]).all() and not torch.isfinite(out[5]).all()
    assert not torch.isfinite(expected[3]).all() and not torch.isfinite(expected[5]).all()
    ok = [0, 1, 2, 4, 6, 7]  # the other envs are unaffected
    assert torch.isfinite(out[ok]).all()
    torch.testing.assert_close(out[ok], expected[ok], rtol=1e-4, atol=1e-3)


# ---- (f) dispatcher -----------------------------------------------------------------------------
@numba_only
def test_dispatch_torch_and_numba_agree():
    x, p, u = random_batch(33, seed=5)
    outs = {}
    for impl in ("torch", "numba", "auto"):
        xi = x.clone()
        ret = qk.rk4_step_(xi, p, u, DT, impl=impl)
        assert ret is xi  # every impl updates in place
        outs[impl] = xi
    torch.testing.assert_close(outs["numba"], outs["torch"], rtol=1e-4, atol=1e-3)
    assert torch.equal(outs["auto"], outs["numba"])  # auto picks numba on CPU


def test_dispatch_numba_on_non_cpu_raises():
    """The meta device stands in for a GPU: no data, so only the device check can run."""
    x = torch.zeros(4, qk.STATE_DIM, device="meta")
    p = torch.zeros(4, qk.PARAM_DIM, device="meta")
    u = torch.zeros(4, 4, device="meta")
    with pytest.raises(ValueError, match="CPU"):
        qk.rk4_step_(x, p, u, DT, impl="numba")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dispatch_on_cuda():
    x, p, u = random_batch(16, seed=6)
    xc, pc, uc = x.cuda(), p.cuda(), u.cuda()
    with pytest.raises(ValueError, match="CPU"):
        qk.rk4_step_(xc.clone(), pc, uc, DT, impl="numba")
    out = qk.rk4_step_(xc, pc, uc, DT)  # auto -> torch on CUDA
    torch.testing.assert_close(out.cpu(), qk.rk4_step_torch(x, p, u, DT), rtol=1e-4, atol=1e-3)


def test_dispatch_unknown_impl_raises():
    x, p, u = random_batch(2, seed=7)
    with pytest.raises(ValueError, match="unknown quadrotor kernel 'triton'"):
        qk.rk4_step_(x, p, u, DT, impl="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_path_on_cuda_matches_the_cpu_over_many_steps():
    """100 steps at the hover command from random attitudes: the CUDA and CPU torch paths do not drift apart."""
    x, p, _ = random_batch(256, seed=2)
    x[:, 10:13] *= 0.1
    u = torch.full((256, 4), P.hover_rpm, dtype=torch.float32)
    xc, pc, uc = x.cuda(), p.cuda(), u.cuda()
    for _ in range(100):
        x = qk.rk4_step_torch(x, p, u, DT)
        xc = qk.rk4_step_(xc, pc, uc, DT)
    torch.testing.assert_close(xc.cpu(), x, rtol=1e-3, atol=1e-3)
