"""The numba CPU kernels of the quadrotor: the RK4 step of ``kernels/quadrotor.py`` and the fused
quadrotor-hover task step.

Module-level functions with no captured constants, so ``cache=True`` reuses the compiled code across
processes (a closure recompiled on every run: ~3 s per training start). Rotor geometry and gravity
come in as the array ``geo = [x0..x3, y0..y3, dir0..dir3, g]``. Both kernels live in this one file on
purpose: numba's on-disk cache checks only the file a cached function is defined in, so a fused step
inlining physics from another file would keep running stale physics after an edit there.

The fused quadrotor-hover step (``hover_step``, ``hover_reset``): physics, reward terms, termination,
truncation, numerical-fault recovery, same-step reset and both observation groups in one pass over the
batch. The torch reference is ``QuadrotorHoverEnv`` with ``kernel=torch`` (``embodied/tasks/quadrotor/hover.py``
and ``ManagedVecEnv.step``); this kernel computes the same MDP with one call per step instead of ~100
small tensor ops (tests/tasks/test_quadrotor_fused.py checks every term against it). Random numbers come
from a splitmix64 stream whose state (``rng``, uint64 ``[1]``) the env owns and checkpoints, so the two
paths draw different noise and initial states from the same distributions. Scalars come in as the
float32 vector ``c`` (indices below), so the compiled code is shared by every configuration. Its
fast-math flags leave out ``nnan``/``ninf``: the fault check must see NaN and inf.
"""

import math

import numba as nb
import numpy as np

from embodied.kernels.copy_numba import copy2


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


# ==== the fused quadrotor-hover step =============================================================
# ---- indices into the config vector ``c`` (float32) ---------------------------------------------
# (the step dt is an argument of its own: in float32 it would round the RK4 weights differently)
RPM_MAX, HOVER_ACTION, SUCCESS_RADIUS, TERM_RADIUS, MAX_STEPS, SUCCESS_STEPS = range(6)
# reward coefficients as the reference computes them: -scale * weight (constant and termination as is)
C_CONSTANT, C_POSITION, C_POSITION_ABS, C_ORIENTATION, C_LIN_VEL, C_ACTION, C_TERMINATION = range(6, 13)
INIT_POSITION, INIT_MAX_ANGLE, INIT_LIN_VEL, INIT_ANG_VEL, INIT_GUIDANCE = range(13, 18)
NOISE = 18  # 4 entries: position, rotation matrix, linear velocity, angular velocity std
DIST_FORCE, DIST_TORQUE, ARM, GRAV = range(22, 26)
DR_ENABLED = 26
DR_RANGE = 27  # 6 (lo, hi) factor ranges: the DR_PARAM_COLUMNS in order, then the observation noise std
POS_DECAY = 39  # the position average's per-step decay (QuadrotorHoverEnv.position_decay)
C_FLOOR = 40  # the least reward of a step (-inf: none)
DR_HARD = 41  # the share of resets that draw a hard plant
DR_HARD_THIRD = 42  # 5 entries, DR_PARAM_COLUMNS order: the third of its range (0, 1, 2) a hard plant's factor is
# drawn from, -1: the whole range
CONFIG_DIM = 47
# parameter columns domain randomization scales (mass, inertia xyz share one factor, k_f, k_m, motor_tau)
DR_PARAM_COLUMNS = (0, 1, 4, 5, 6)

# ---- the log vector: batch means --------------------------------------------------------------
LOG_TERMS = ("constant", "position", "position_abs", "orientation", "lin_vel", "action", "termination", "floor")
L_DISTANCE = 8
L_DR = 9  # 6 entries: parameter / nominal for DR_PARAM_COLUMNS (inertia: its xx entry), noise factor
LOG_DIM = 15

FASTMATH = {"nsz", "arcp", "afn"}  # no nnan / ninf (isfinite must stay honest), no contract (FMA rounds
# differently from the two roundings of the torch reference)
CLEAN_DIM = 18  # position 3, rotation matrix 9 (row-major), linear velocity 3, angular velocity 3
CRITIC_DIM = 28  # clean, disturbance force / mg, torque / (mg arm), rotor speeds in [-1, 1]
# with domain randomization the critic also sees log(factor) of the 5 parameters and of the noise std


# ---- splitmix64 --------------------------------------------------------------------------------
@nb.njit(inline="always", cache=True)
def _next(rng):
    z = rng[0] + np.uint64(0x9E3779B97F4A7C15)
    rng[0] = z
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always", cache=True)
def uniform(rng):
    """U[0, 1) with 53 random bits."""
    return np.float64(_next(rng) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@nb.njit(inline="always", cache=True)
def normal_pair(rng):
    """Two independent N(0, 1) by Marsaglia's polar method: a point (u, v) uniform in the unit disc (two 24-bit
    uniforms in [-1, 1) from one 64-bit draw; ~21% of draws fall outside and are redrawn), scaled by
    sqrt(-2 ln s / s), s = u^2 + v^2 (float32 math). One log and one sqrt a pair instead of Box-Muller's log,
    sqrt, sin and cos: ~100 against ~150 ns for an env's 9 pairs of observation noise."""
    while True:
        z = _next(rng)
        u = np.float32(z >> np.uint64(40)) * np.float32(2.0 / 16777216.0) - np.float32(1.0)
        v = np.float32((z >> np.uint64(8)) & np.uint64(0xFFFFFF)) * np.float32(2.0 / 16777216.0) - np.float32(1.0)
        s = u * u + v * v
        if np.float32(0.0) < s < np.float32(1.0):
            f = math.sqrt(np.float32(-2.0) * math.log(s) / s)
            return u * f, v * f


# ---- pieces -----------------------------------------------------------------------------------
@nb.njit(inline="always", fastmath=FASTMATH, cache=True, error_model="numpy")
def _reset(i, x, p, noise_scale, hist, ep_len, last_out, nominal, c, rng):
    """Initial state of env ``i`` (QuadrotorHoverEnv._reset_idx and _sample_params)."""
    xi, pi = x[i], p[i]
    for j in range(3):
        xi[j] = (2.0 * uniform(rng) - 1.0) * c[INIT_POSITION]
    ax, ay = normal_pair(rng)
    az, g0 = normal_pair(rng)
    norm = max(math.sqrt(ax * ax + ay * ay + az * az), 1e-9)
    half = 0.5 * uniform(rng) * c[INIT_MAX_ANGLE]
    s = math.sin(half) / norm
    xi[3], xi[4], xi[5], xi[6] = math.cos(half), ax * s, ay * s, az * s
    for j in range(3):
        xi[7 + j] = (2.0 * uniform(rng) - 1.0) * c[INIT_LIN_VEL]
    for j in range(3):
        xi[10 + j] = (2.0 * uniform(rng) - 1.0) * c[INIT_ANG_VEL]
    if uniform(rng) < c[INIT_GUIDANCE]:  # level at rest at the set-point
        for j in range(13):
            xi[j] = 0.0
        xi[3] = 1.0
    for j in range(4):
        xi[13 + j] = 0.5 * c[RPM_MAX]
    for j in range(pi.shape[0]):
        pi[j] = nominal[j]
    noise_scale[i] = 1.0
    if c[DR_ENABLED] != 0.0:
        hard = c[DR_HARD] > 0.0 and uniform(rng) < c[DR_HARD]  # no draw when the share is 0: the stream as before
        for k in range(6):
            lo, hi = c[DR_RANGE + 2 * k], c[DR_RANGE + 2 * k + 1]
            u = uniform(rng)
            if hard and k < 5 and c[DR_HARD_THIRD + k] >= 0.0:
                u = (c[DR_HARD_THIRD + k] + u) / 3.0
            f = lo + (hi - lo) * u
            if k == 5:
                noise_scale[i] = f
                continue
            col = DR_PARAM_COLUMNS[k]
            pi[col] *= f
            if col == 1:  # the three inertia entries share one factor
                pi[2] *= f
                pi[3] *= f
    mg = pi[0] * c[GRAV]
    g1, g2 = normal_pair(rng)
    g3, g4 = normal_pair(rng)
    pi[7], pi[8], pi[9] = g0 * mg * c[DIST_FORCE], g1 * mg * c[DIST_FORCE], g2 * mg * c[DIST_FORCE]
    pi[10], pi[11], pi[12] = g3 * mg * c[DIST_TORQUE], g4 * mg * c[DIST_TORQUE], normal_pair(rng)[0] * mg * c[
        DIST_TORQUE]
    hist[i, :] = 0.0
    last_out[i] = 0
    ep_len[i] = 0


@nb.njit(inline="always", fastmath=FASTMATH, cache=True, error_model="numpy")
def _observe(i, x, p, noise_scale, hist, ep_len, nominal, c, rng, pol, cri, pos_avg):
    """Both observation groups of env ``i`` (QuadrotorHoverEnv._observe); advances the average of the observed
    position (its first value at an episode's first observation)."""
    xi, pi, oi, ci = x[i], p[i], pol[i], cri[i]
    w, qx, qy, qz = xi[3], xi[4], xi[5], xi[6]
    two = np.float32(2.0)
    one = np.float32(1.0)
    ci[0], ci[1], ci[2] = xi[0], xi[1], xi[2]
    ci[3] = one - two * (qy * qy + qz * qz)
    ci[4] = two * (qx * qy - w * qz)
    ci[5] = two * (qx * qz + w * qy)
    ci[6] = two * (qx * qy + w * qz)
    ci[7] = one - two * (qx * qx + qz * qz)
    ci[8] = two * (qy * qz - w * qx)
    ci[9] = two * (qx * qz - w * qy)
    ci[10] = two * (qy * qz + w * qx)
    ci[11] = one - two * (qx * qx + qy * qy)
    for j in range(6):
        ci[12 + j] = xi[7 + j]
    f = noise_scale[i]
    for j in range(0, CLEAN_DIM, 2):  # noise std per group: position 0:3, rotation 3:12, lin 12:15, ang 15:18
        g0, g1 = normal_pair(rng)
        oi[j] = ci[j] + g0 * (f * c[NOISE + (0 if j < 3 else (1 if j < 12 else (2 if j < 15 else 3)))])
        oi[j + 1] = ci[j + 1] + g1 * (f * c[NOISE + (0 if j + 1 < 3 else (1 if j + 1 < 12 else (2 if j + 1 < 15
                                                                                                 else 3)))])
    h = hist.shape[1]
    for j in range(h):
        oi[CLEAN_DIM + j] = hist[i, j]
    decay = np.float32(c[POS_DECAY])
    for j in range(pos_avg.shape[1]):
        if ep_len[i] == 0:
            pos_avg[i, j] = oi[j]
        else:
            pos_avg[i, j] = decay * pos_avg[i, j] + (np.float32(1.0) - decay) * oi[j]
        oi[CLEAN_DIM + h + j] = pos_avg[i, j]
    mg = pi[0] * np.float32(c[GRAV])
    for j in range(3):
        ci[18 + j] = pi[7 + j] / mg
        ci[21 + j] = pi[10 + j] / (mg * np.float32(c[ARM]))
    scale = np.float32(2.0 / c[RPM_MAX])
    for j in range(4):
        ci[24 + j] = xi[13 + j] * scale - one
    if ci.shape[0] > CRITIC_DIM:  # domain randomization: the sampled plant, as log(factor)
        for k in range(5):
            col = DR_PARAM_COLUMNS[k]
            ci[CRITIC_DIM + k] = math.log(pi[col] / nominal[col])
        ci[CRITIC_DIM + 5] = math.log(f)


# ---- the step -----------------------------------------------------------------------------------
@nb.njit(fastmath=FASTMATH, cache=True, error_model="numpy")
def hover_step(action, x, p, noise_scale, hist, ep_len, last_out, nominal, c, dt, geo, rng,
               pol, cri, final_pol, final_cri, reward, terminated, truncated, success, faulted, log, pos_avg):
    """One control step of every env. Writes the outputs (``pol .. faulted``) and the batch means into
    ``log``; returns (number of envs with a numerical fault, whether any episode ended).
    ``final_pol/final_cri`` hold the observations before the reset, valid when an episode ended; ``dt``
    [s] comes as a float64 (the RK4 weights rounded once, as the reference rounds them)."""
    n, h = x.shape[0], hist.shape[1]
    k1 = np.empty(17, np.float32)
    k2 = np.empty(17, np.float32)
    k3 = np.empty(17, np.float32)
    k4 = np.empty(17, np.float32)
    tmp = np.empty(17, np.float32)
    a = np.empty(4, np.float32)
    u = np.empty(4, np.float32)
    log[:] = 0.0
    rpm_max = np.float32(c[RPM_MAX])
    half_range = np.float32(0.5 * c[RPM_MAX])
    hover = np.float32(c[HOVER_ACTION])
    num_bad = 0
    any_done = False
    for i in range(n):
        xi = x[i]
        for j in range(4):
            a[j] = min(max(action[i, j], np.float32(-1.0)), np.float32(1.0))
        for j in range(h - 4):
            hist[i, j] = hist[i, j + 4]
        for j in range(4):
            hist[i, h - 4 + j] = a[j]
            u[j] = min(max((a[j] + np.float32(1.0)) * half_range, np.float32(0.0)), rpm_max)
        rk4_one(xi, p[i], u, dt, geo, k1, k2, k3, k4, tmp)
        ep_len[i] += 1
        d2 = xi[0] * xi[0] + xi[1] * xi[1] + xi[2] * xi[2]
        dist = np.float32(math.sqrt(d2))
        if dist > c[SUCCESS_RADIUS]:
            last_out[i] = ep_len[i]
        v2 = xi[7] * xi[7] + xi[8] * xi[8] + xi[9] * xi[9]
        da = np.float32(0.0)
        for j in range(4):
            da += (a[j] - hover) * (a[j] - hover)
        term = dist > c[TERM_RADIUS]
        t0 = np.float32(c[C_CONSTANT])
        t1 = np.float32(c[C_POSITION]) * d2
        t2 = np.float32(c[C_POSITION_ABS]) * dist
        t3 = np.float32(c[C_ORIENTATION]) * (np.float32(1.0) - xi[3] * xi[3])
        t4 = np.float32(c[C_LIN_VEL]) * v2
        t5 = np.float32(c[C_ACTION]) * da
        t6 = -np.float32(c[C_TERMINATION]) * np.float32(1.0 if term else 0.0)
        r = np.float32(0.0) + t0 + t1 + t2 + t3 + t4 + t5 + t6
        t7 = max(np.float32(c[C_FLOOR]) - r, np.float32(0.0))
        r = r + t7
        log[0] += t0
        log[1] += t1
        log[2] += t2
        log[3] += t3
        log[4] += t4
        log[5] += t5
        log[6] += t6
        log[7] += t7
        log[L_DISTANCE] += dist
        if c[DR_ENABLED] != 0.0:
            for k in range(5):
                col = DR_PARAM_COLUMNS[k]
                log[L_DR + k] += p[i, col] / nominal[col]
            log[L_DR + 5] += noise_scale[i]
        finite = math.isfinite(r)
        for j in range(17):
            finite = finite and math.isfinite(xi[j])
        trunc = ep_len[i] >= c[MAX_STEPS]
        if not finite:  # ends as truncated (no bootstrap from garbage), reward zeroed, counted
            num_bad += 1
            r = np.float32(0.0)
            term = False
            trunc = True
        reward[i] = r
        faulted[i] = not finite
        terminated[i] = term
        truncated[i] = trunc
        any_done = any_done or term or trunc
        success[i] = 1.0 if (ep_len[i] >= c[MAX_STEPS] and ep_len[i] - last_out[i] >= c[SUCCESS_STEPS]) else 0.0
        _observe(i, x, p, noise_scale, hist, ep_len, nominal, c, rng, pol, cri, pos_avg)
    for j in range(log.shape[0]):
        log[j] /= n
    if any_done:
        copy2(final_pol, pol)  # not final_pol[:] = pol (kernels/copy_numba.py)
        copy2(final_cri, cri)
        for i in range(n):
            if not (terminated[i] or truncated[i]):
                continue
            if num_bad:  # never hand non-finite observations to a learner
                for j in range(pol.shape[1]):
                    if not math.isfinite(final_pol[i, j]):
                        final_pol[i, j] = 0.0
                for j in range(cri.shape[1]):
                    if not math.isfinite(final_cri[i, j]):
                        final_cri[i, j] = 0.0
            _reset(i, x, p, noise_scale, hist, ep_len, last_out, nominal, c, rng)
            _observe(i, x, p, noise_scale, hist, ep_len, nominal, c, rng, pol, cri, pos_avg)
    return num_bad, any_done


@nb.njit(fastmath=FASTMATH, cache=True, error_model="numpy")
def hover_reset(x, p, noise_scale, hist, ep_len, last_out, nominal, c, rng, pol, cri, pos_avg):
    """Initial states and observations of every env."""
    for i in range(x.shape[0]):
        _reset(i, x, p, noise_scale, hist, ep_len, last_out, nominal, c, rng)
        _observe(i, x, p, noise_scale, hist, ep_len, nominal, c, rng, pol, cri, pos_avg)
