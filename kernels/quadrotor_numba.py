"""The numba CPU kernel of ``kernels/quadrotor.py`` (imported on first use, numba being optional).

Module-level functions with no captured constants, so ``cache=True`` reuses the compiled code across
processes (a closure recompiled on every run: ~3 s per training start). Rotor geometry and gravity
come in as the array ``geo = [x0..x3, y0..y3, dir0..dir3, g]``.
"""

import numba as nb
import numpy as np


@nb.njit(inline="always", fastmath=True, cache=True, error_model="numpy")
def deriv(x, p, u, k, geo):
    rx0, rx1, rx2, rx3 = geo[0], geo[1], geo[2], geo[3]
    ry0, ry1, ry2, ry3 = geo[4], geo[5], geo[6], geo[7]
    d0, d1, d2, d3 = geo[8], geo[9], geo[10], geo[11]
    g = geo[12]
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

@nb.njit(inline="always", fastmath=True, cache=True, error_model="numpy")
def rk4_one(xi, pi, ui, dt, geo, k1, k2, k3, k4, tmp):
    """One env's RK4 step in place (``k1..k4, tmp``: float32 scratch of 17), quaternion renormalized."""
    h = np.float32(0.5 * dt)
    full = np.float32(dt)
    sixth = np.float32(dt / 6.0)
    deriv(xi, pi, ui, k1, geo)
    for j in range(17):
        tmp[j] = xi[j] + h * k1[j]
    deriv(tmp, pi, ui, k2, geo)
    for j in range(17):
        tmp[j] = xi[j] + h * k2[j]
    deriv(tmp, pi, ui, k3, geo)
    for j in range(17):
        tmp[j] = xi[j] + full * k3[j]
    deriv(tmp, pi, ui, k4, geo)
    for j in range(17):
        xi[j] = xi[j] + sixth * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j])
    inv = 1.0 / np.sqrt(xi[3] * xi[3] + xi[4] * xi[4] + xi[5] * xi[5] + xi[6] * xi[6])
    xi[3] *= inv
    xi[4] *= inv
    xi[5] *= inv
    xi[6] *= inv


@nb.njit(fastmath=True, cache=True, error_model="numpy")
def rk4_inplace(x, p, u, dt, geo):
    k1 = np.empty(17, np.float32)
    k2 = np.empty(17, np.float32)
    k3 = np.empty(17, np.float32)
    k4 = np.empty(17, np.float32)
    tmp = np.empty(17, np.float32)
    for i in range(x.shape[0]):
        rk4_one(x[i], p[i], u[i], dt, geo, k1, k2, k3, k4, tmp)
