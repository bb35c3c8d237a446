"""Exact-value tests for ``embodied.core.rotations`` (quaternions (w, x, y, z), Hamilton product,
body -> world), plus the pendulum backend against gymnasium's ``Pendulum-v1`` dynamics."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.core.rotations import (
    quat_conj,
    quat_from_axis_angle,
    quat_mul,
    quat_rotate,
    quat_to_rotmat,
    random_unit_vectors,
    tilt_angle,
)
from embodied.sim_backends.torch_vec.pendulum import PendulumParams, PendulumSim

F64 = torch.float64
ONE = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
QI = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=F64)
QJ = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=F64)
QK = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64)
S = math.sqrt(0.5)


def t(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F64)


def random_quats(n: int, seed: int = 0) -> torch.Tensor:
    q = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return q / q.norm(dim=1, keepdim=True)


# ---- quat_mul -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, expected",
    [
        (QI, QJ, QK),  # ij = k
        (QJ, QI, -QK),  # ji = -k
        (QJ, QK, QI),  # jk = i
        (QK, QJ, -QI),
        (QK, QI, QJ),  # ki = j
        (QI, QK, -QJ),
        (QI, QI, -ONE),  # i^2 = j^2 = k^2 = -1
        (QJ, QJ, -ONE),
        (QK, QK, -ONE),
        (ONE, QK, QK),  # identity
    ],
)
def test_quat_mul_units(a, b, expected):
    assert torch.equal(quat_mul(a, b), expected)


def test_quat_mul_hand_computed():
    # (1 + 2i + 3j + 4k)(5 + 6i + 7j + 8k) = -60 + 12i + 30j + 24k
    assert torch.equal(quat_mul(t(1, 2, 3, 4), t(5, 6, 7, 8)), t(-60, 12, 30, 24))
    # and the other order differs only in the cross-product part: -60 + 20i + 14j + 32k
    assert torch.equal(quat_mul(t(5, 6, 7, 8), t(1, 2, 3, 4)), t(-60, 20, 14, 32))


def test_quat_mul_identity_and_batch_broadcast():
    q = random_quats(16)
    torch.testing.assert_close(quat_mul(ONE.expand(16, 4), q), q)
    torch.testing.assert_close(quat_mul(q, ONE.expand(16, 4)), q)
    # q q* = 1 for unit q
    torch.testing.assert_close(quat_mul(q, quat_conj(q)), ONE.expand(16, 4), rtol=0, atol=1e-15)
    # associativity on a batch
    a, b, c = random_quats(8, 1), random_quats(8, 2), random_quats(8, 3)
    torch.testing.assert_close(quat_mul(quat_mul(a, b), c), quat_mul(a, quat_mul(b, c)))


# ---- conjugate, rotate --------------------------------------------------------------------------
def test_quat_conj():
    assert torch.equal(quat_conj(t(1, 2, 3, 4)), t(1, -2, -3, -4))
    q = random_quats(5)
    assert torch.equal(quat_conj(quat_conj(q)), q)


@pytest.mark.parametrize(
    "q, v, expected",
    [
        (t(S, 0, 0, S), t(1, 0, 0), t(0, 1, 0)),  # 90 deg about z: x -> y
        (t(S, 0, 0, S), t(0, 1, 0), t(-1, 0, 0)),  # y -> -x
        (t(S, S, 0, 0), t(0, 1, 0), t(0, 0, 1)),  # 90 deg about x: y -> z
        (t(S, 0, S, 0), t(0, 0, 1), t(1, 0, 0)),  # 90 deg about y: z -> x
        (t(0, 1, 0, 0), t(0, 1, 0), t(0, -1, 0)),  # 180 deg about x: y -> -y
        (ONE, t(0.3, -2.0, 7.0), t(0.3, -2.0, 7.0)),
    ],
)
def test_quat_rotate_known(q, v, expected):
    torch.testing.assert_close(quat_rotate(q, v), expected, rtol=0, atol=1e-15)


def test_quat_rotate_preserves_norm_and_inverts():
    q = random_quats(32)
    v = torch.randn(32, 3, generator=torch.Generator().manual_seed(9), dtype=F64)
    r = quat_rotate(q, v)
    torch.testing.assert_close(r.norm(dim=1), v.norm(dim=1))
    torch.testing.assert_close(quat_rotate(quat_conj(q), r), v)


# ---- rotation matrix ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "q, expected",
    [
        (ONE, [[1, 0, 0], [0, 1, 0], [0, 0, 1]]),
        (t(S, 0, 0, S), [[0, -1, 0], [1, 0, 0], [0, 0, 1]]),  # 90 deg about z
        (t(S, S, 0, 0), [[1, 0, 0], [0, 0, -1], [0, 1, 0]]),  # 90 deg about x
        (t(S, 0, S, 0), [[0, 0, 1], [0, 1, 0], [-1, 0, 0]]),  # 90 deg about y
        (t(0, 0, 1, 0), [[-1, 0, 0], [0, 1, 0], [0, 0, -1]]),  # 180 deg about y
    ],
)
def test_quat_to_rotmat_known(q, expected):
    torch.testing.assert_close(quat_to_rotmat(q), torch.tensor(expected, dtype=F64), rtol=0, atol=1e-15)


def test_quat_to_rotmat_orthonormal_and_consistent_with_rotate():
    q = random_quats(64, seed=4)
    r = quat_to_rotmat(q)
    assert r.shape == (64, 3, 3)
    eye = torch.eye(3, dtype=F64).expand(64, 3, 3)
    torch.testing.assert_close(r @ r.transpose(1, 2), eye)
    torch.testing.assert_close(torch.linalg.det(r), torch.ones(64, dtype=F64))
    v = torch.randn(64, 3, generator=torch.Generator().manual_seed(5), dtype=F64)
    torch.testing.assert_close((r @ v[:, :, None])[:, :, 0], quat_rotate(q, v))
    # R(a b) = R(a) R(b)
    b = random_quats(64, seed=6)
    torch.testing.assert_close(quat_to_rotmat(quat_mul(q, b)), r @ quat_to_rotmat(b))
    # leading batch dims are kept
    assert quat_to_rotmat(q.reshape(4, 16, 4)).shape == (4, 16, 3, 3)


# ---- axis-angle, tilt ---------------------------------------------------------------------------
def test_quat_from_axis_angle():
    torch.testing.assert_close(quat_from_axis_angle(t(0, 0, 1), scalar(math.pi / 2)), t(S, 0, 0, S))
    torch.testing.assert_close(quat_from_axis_angle(t(1, 0, 0), scalar(math.pi)), t(0, 1, 0, 0), rtol=0, atol=1e-16)
    torch.testing.assert_close(quat_from_axis_angle(t(0, 1, 0), scalar(0.0)), ONE)
    # batched: angle [N], axis [N, 3]
    axis = random_unit_vectors(10, torch.Generator().manual_seed(0), "cpu").to(F64)
    angle = torch.linspace(-3.0, 3.0, 10, dtype=F64)
    q = quat_from_axis_angle(axis, angle)
    torch.testing.assert_close(q.norm(dim=1), torch.ones(10, dtype=F64))
    torch.testing.assert_close(q[:, 0], torch.cos(angle / 2))
    # the axis is fixed by the rotation
    torch.testing.assert_close(quat_rotate(q, axis), axis)


def test_random_unit_vectors():
    v1 = random_unit_vectors(100, torch.Generator().manual_seed(0), "cpu")
    v2 = random_unit_vectors(100, torch.Generator().manual_seed(0), "cpu")
    assert v1.shape == (100, 3)
    assert torch.equal(v1, v2)  # seeded
    torch.testing.assert_close(v1.norm(dim=1), torch.ones(100))


def test_tilt_angle():
    x_axis, y_axis, z_axis = t(1, 0, 0), t(0, 1, 0), t(0, 0, 1)
    for angle in (0.0, 0.3, 1.0, math.pi / 2, 2.5):
        a = scalar(angle)
        torch.testing.assert_close(tilt_angle(quat_from_axis_angle(x_axis, a)), a, rtol=0, atol=1e-7)
        torch.testing.assert_close(tilt_angle(quat_from_axis_angle(y_axis, a)), a, rtol=0, atol=1e-7)
        # pure yaw never tilts
        torch.testing.assert_close(tilt_angle(quat_from_axis_angle(z_axis, a)), scalar(0.0), rtol=0, atol=1e-7)
    torch.testing.assert_close(tilt_angle(t(0, 1, 0, 0)), scalar(math.pi))  # upside down
    # batched and equal to the angle between body z and world z
    q = random_quats(20, seed=8)
    body_z = quat_rotate(q, z_axis.expand(20, 3))
    torch.testing.assert_close(tilt_angle(q), torch.acos(body_z[:, 2].clamp(-1, 1)))


# ---- pendulum backend vs gymnasium Pendulum-v1 --------------------------------------------------
def test_pendulum_matches_gymnasium():
    """Same state and torque -> same (theta, theta_dot) as gymnasium's step for 20 steps, covering
    torque clipping (|u| > 2) and speed clipping (|theta_dot| hits 8)."""
    starts = [(0.1, 0.0), (math.pi, 0.5), (-2.0, -7.9), (1.0, 7.5), (3.0, -3.0)]
    torques = [0.0, 1.5, -2.0, 5.0, -10.0]  # the last two are clipped to +-2
    n = len(starts)
    sim = PendulumSim(n, "cpu", PendulumParams())
    sim.x = torch.tensor(starts, dtype=torch.float32)
    env = gym.make("Pendulum-v1")
    env.reset(seed=0)
    states = [np.array(s, dtype=np.float64) for s in starts]
    max_speed = 0.0
    for step in range(20):
        u = torch.tensor(torques, dtype=torch.float32)[:, None] * (1 if step % 2 == 0 else -1)
        sim.step(u)
        for i in range(n):
            env.unwrapped.state = states[i]
            env.step(np.array([u[i, 0].item()], dtype=np.float32))
            states[i] = np.asarray(env.unwrapped.state, dtype=np.float64)
        expected = torch.tensor(np.stack(states), dtype=torch.float32)
        torch.testing.assert_close(sim.x, expected, rtol=1e-5, atol=1e-5, msg=lambda m, k=step: f"step {k}: {m}")
        max_speed = max(max_speed, float(np.abs(np.stack(states)[:, 1]).max()))
    assert max_speed == pytest.approx(8.0)  # speed clip was exercised
    env.close()
