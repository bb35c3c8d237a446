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
    """Reference RK4 step; returns the new state (input untouched). Runs on any device."""
    k1 = derivative_torch(x, p, u)
    k2 = derivative_torch(x + (0.5 * dt) * k1, p, u)
    k3 = derivative_torch(x + (0.5 * dt) * k2, p, u)
    k4 = derivative_torch(x + dt * k3, p, u)
    out = x + (dt / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
    q = out[:, 3:7]
    out[:, 3:7] = q / q.norm(dim=1, keepdim=True)
    return out


# ---- numba CPU kernel ---------------------------------------------------------------------------
_numba_kernel = None


def _build_numba():
    import numba as nb

    rx0, rx1, rx2, rx3 = ROTOR_X
    ry0, ry1, ry2, ry3 = ROTOR_Y
    d0, d1, d2, d3 = ROTOR_DIR
    g = GRAVITY

    @nb.njit(inline="always", fastmath=True, cache=True, error_model="numpy")
    def deriv(x, p, u, k):
        qw, qx, qy, qz = x[3], x[4], x[5], x[6]
        wx, wy, wz = x[10], x[11], x[12]
        kf = p[4]
        f0 = kf * x[13] * x[13]
        f1 = kf * x[14] * x[14]
        f2 = kf * x[15] * x[15]
        f3 = kf * x[16] * x[16]
        thrust = f0 + f1 + f2 + f3
        tx = ry0 * f0 + ry1 * f1 + ry2 * f2 + ry3 * f3 + p[10]
        ty = -(rx0 * f0 + rx1 * f1 + rx2 * f2 + rx3 * f3) + p[11]
        tz = p[5] * (d0 * f0 + d1 * f1 + d2 * f2 + d3 * f3) + p[12]
        inv_m = 1.0 / p[0]
        k[0] = x[7]
        k[1] = x[8]
        k[2] = x[9]
        k[3] = 0.5 * (-qx * wx - qy * wy - qz * wz)
        k[4] = 0.5 * (qw * wx + qy * wz - qz * wy)
        k[5] = 0.5 * (qw * wy - qx * wz + qz * wx)
        k[6] = 0.5 * (qw * wz + qx * wy - qy * wx)
        k[7] = (2.0 * (qx * qz + qw * qy) * thrust + p[7]) * inv_m
        k[8] = (2.0 * (qy * qz - qw * qx) * thrust + p[8]) * inv_m
        k[9] = ((1.0 - 2.0 * (qx * qx + qy * qy)) * thrust + p[9]) * inv_m - g
        jx, jy, jz = p[1], p[2], p[3]
        # w x (J w)
        cx = wy * (jz * wz) - wz * (jy * wy)
        cy = wz * (jx * wx) - wx * (jz * wz)
        cz = wx * (jy * wy) - wy * (jx * wx)
        k[10] = (tx - cx) / jx
        k[11] = (ty - cy) / jy
        k[12] = (tz - cz) / jz
        inv_tm = 1.0 / p[6]
        k[13] = (u[0] - x[13]) * inv_tm
        k[14] = (u[1] - x[14]) * inv_tm
        k[15] = (u[2] - x[15]) * inv_tm
        k[16] = (u[3] - x[16]) * inv_tm

    @nb.njit(fastmath=True, cache=True, error_model="numpy")
    def rk4_inplace(x, p, u, dt):
        n = x.shape[0]
        k1 = np.empty(17, np.float32)
        k2 = np.empty(17, np.float32)
        k3 = np.empty(17, np.float32)
        k4 = np.empty(17, np.float32)
        tmp = np.empty(17, np.float32)
        h = np.float32(0.5 * dt)
        full = np.float32(dt)
        sixth = np.float32(dt / 6.0)
        for i in range(n):
            xi = x[i]
            pi = p[i]
            ui = u[i]
            deriv(xi, pi, ui, k1)
            for j in range(17):
                tmp[j] = xi[j] + h * k1[j]
            deriv(tmp, pi, ui, k2)
            for j in range(17):
                tmp[j] = xi[j] + h * k2[j]
            deriv(tmp, pi, ui, k3)
            for j in range(17):
                tmp[j] = xi[j] + full * k3[j]
            deriv(tmp, pi, ui, k4)
            for j in range(17):
                xi[j] = xi[j] + sixth * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j])
            inv = 1.0 / np.sqrt(xi[3] * xi[3] + xi[4] * xi[4] + xi[5] * xi[5] + xi[6] * xi[6])
            xi[3] *= inv
            xi[4] *= inv
            xi[5] *= inv
            xi[6] *= inv

    return rk4_inplace


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def rk4_step_numba_(x: torch.Tensor, p: torch.Tensor, u: torch.Tensor, dt: float) -> torch.Tensor:
    """In-place numba RK4 on CPU float32 contiguous tensors; returns ``x``."""
    for name, t in (("state", x), ("params", p), ("controls", u)):
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"numba quadrotor kernel needs contiguous float32 CPU tensors; {name} is "
                             f"{t.dtype} on {t.device}{'' if t.is_contiguous() else ', non-contiguous'}")
    global _numba_kernel
    if _numba_kernel is None:
        _numba_kernel = _build_numba()
    _numba_kernel(x.numpy(), p.numpy(), u.numpy(), dt)
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
