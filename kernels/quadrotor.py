"""Quadrotor rigid-body RK4 step: plain-torch reference (any device) and a numba CPU kernel.

State layout ``x: [N, 17]`` (float32), world frame ENU-like with z up:
    0:3   pos_w [m]        3:7   quat_wb (w, x, y, z), body -> world
    7:10  lin_vel_w [m/s]  10:13 ang_vel_b [rad/s]     13:17 rpm [1/min] (actual rotor speeds)
Parameters ``p: [N, 13]`` (per env, so domain randomization is free):
    0 mass [kg]  1:4 inertia diag [kg m^2]  4 k_f thrust [N/rpm^2]  5 k_m torque/thrust [m]
    6 motor time constant [s]  7:10 disturbance force_w [N]  10:13 disturbance torque_b [N m]
Controls ``u: [N, 4]``: commanded rpm, already clipped to the motor range.

Dynamics (Learning to Fly in Seconds, Eschmann et al. 2023; ../shared/reference/quadrotor.md 1.2):
    f_i = k_f rpm_i^2 along body z;  tau = sum r_i x f_i + k_m sum dir_i f_i e_z
    dp = v;  dq = 0.5 q (x) (0, w);  dv = (R f + F_d)/m - g e_z;  dw = J^-1 (tau + T_d - w x J w)
    drpm = (u - rpm) / T_m   (first-order motor lag, integrated inside RK4 like L2F)
After the RK4 step the quaternion is renormalized.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

STATE_DIM = 17
PARAM_DIM = 13
GRAVITY = 9.81
# Crazyflie 2.1 X configuration (L2F crazy_flie.h): rotor x, y [m] and spin direction of yaw torque
ROTOR_X = (0.028, -0.028, -0.028, 0.028)
ROTOR_Y = (-0.028, -0.028, 0.028, 0.028)
ROTOR_DIR = (-1.0, 1.0, -1.0, 1.0)


def derivative_torch(x: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dx/dt for a batch. Shapes ``[N,17], [N,13], [N,4] -> [N,17]``."""
    qw, qx, qy, qz = x[:, 3], x[:, 4], x[:, 5], x[:, 6]
    w = x[:, 10:13]
    rpm = x[:, 13:17]
    mass, inertia, kf, km, tm = p[:, 0], p[:, 1:4], p[:, 4], p[:, 5], p[:, 6]
    f = kf[:, None] * rpm * rpm  # [N,4] thrust per rotor [N]
    rx = f.new_tensor(ROTOR_X)
    ry = f.new_tensor(ROTOR_Y)
    rdir = f.new_tensor(ROTOR_DIR)
    thrust = f.sum(1)
    tau = torch.stack([(ry * f).sum(1), -(rx * f).sum(1), km * (rdir * f).sum(1)], 1)
    # third column of R(q) times total thrust
    fw = torch.stack([2 * (qx * qz + qw * qy), 2 * (qy * qz - qw * qx), 1 - 2 * (qx * qx + qy * qy)], 1)
    acc = (fw * thrust[:, None] + p[:, 7:10]) / mass[:, None]
    acc[:, 2] -= GRAVITY
    wx, wy, wz = w[:, 0], w[:, 1], w[:, 2]
    dq = 0.5 * torch.stack(
        [
            -qx * wx - qy * wy - qz * wz,
            qw * wx + qy * wz - qz * wy,
            qw * wy - qx * wz + qz * wx,
            qw * wz + qx * wy - qy * wx,
        ],
        1,
    )
    jw = inertia * w
    dw = (tau + p[:, 10:13] - torch.linalg.cross(w, jw)) / inertia
    drpm = (u - rpm) / tm[:, None]
    return torch.cat([x[:, 7:10], dq, acc, dw, drpm], 1)


def rk4_step_torch(x: torch.Tensor, p: torch.Tensor, u: torch.Tensor, dt: float) -> torch.Tensor:
    """Reference RK4 step; returns the new state (input untouched). Runs on any device, and autograd runs through it
    (no in-place write into a tensor the backward needs): an analytic policy gradient backpropagates through it."""
    k1 = derivative_torch(x, p, u)
    k2 = derivative_torch(x + (0.5 * dt) * k1, p, u)
    k3 = derivative_torch(x + (0.5 * dt) * k2, p, u)
    k4 = derivative_torch(x + dt * k3, p, u)
    out = x + (dt / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
    q = out[:, 3:7]
    return torch.cat([out[:, :3], q / q.norm(dim=1, keepdim=True), out[:, 7:]], 1)


# ---- numba CPU kernel ---------------------------------------------------------------------------
@functools.cache
def numba_available() -> bool:
    """Asked on every dispatch, so answered once (an import attempt costs ~3 us, half a step at N = 1)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def numba_geometry() -> np.ndarray:
    """Rotor geometry and gravity as the numba kernels take them: ``[x0..x3, y0..y3, dir0..dir3, g]``."""
    return np.array([*ROTOR_X, *ROTOR_Y, *ROTOR_DIR, GRAVITY], np.float32)


@functools.cache
def _numba_kernel():
    """The compiled kernel and its constants, imported on first use (numba is optional)."""
    from embodied.kernels.quadrotor_numba import rk4_inplace

    return rk4_inplace, numba_geometry()


def rk4_step_numba_(x: torch.Tensor, p: torch.Tensor, u: torch.Tensor, dt: float) -> torch.Tensor:
    """In-place numba RK4 on CPU float32 contiguous tensors; returns ``x``."""
    for name, t in (("state", x), ("params", p), ("controls", u)):
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"numba quadrotor kernel needs contiguous float32 CPU tensors; {name} is "
                             f"{t.dtype} on {t.device}{'' if t.is_contiguous() else ', non-contiguous'}")
    rk4_inplace, geometry = _numba_kernel()
    rk4_inplace(x.numpy(), p.numpy(), u.numpy(), dt, geometry)
    return x


def rk4_step_(x: torch.Tensor, p: torch.Tensor, u: torch.Tensor, dt: float, impl: str = "auto") -> torch.Tensor:
    """Dispatch: numba on CPU when available, torch elsewhere. Updates ``x`` in place."""
    if impl == "auto":
        # the kernel computes in float32: other dtypes (float64 for exact-value tests) use torch
        impl = "numba" if x.device.type == "cpu" and x.dtype == torch.float32 and numba_available() else "torch"
    if impl == "numba":
        return rk4_step_numba_(x, p, u.contiguous(), dt)
    if impl == "torch":
        x.copy_(rk4_step_torch(x, p, u, dt))
        return x
    raise ValueError(f"unknown quadrotor kernel {impl!r}; known: auto, numba, torch")
