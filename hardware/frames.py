"""Frame conversions between ours and MAVLink's.

Ours (the tasks' and Crazyflie's): world x forward, y left, z up; body x forward, y left, z up (FLU).
MAVLink / PX4: world NED (x north, y east, z down), body FRD (x forward, y right, z down).
With ``T = diag(1, -1, -1)`` (a 180-degree turn about x, its own inverse) for both world and body:
    p_ours = T p_ned,  v_ours = T v_ned,  w_flu = T w_frd,  R_ours = T R_ned T.
Euler angles are MAVLink's (ZYX: yaw, then pitch, then roll, ``R = Rz(yaw) Ry(pitch) Rx(roll)``)."""

from __future__ import annotations

import math

import numpy as np

T = np.diag([1.0, -1.0, -1.0])


def euler_to_rotmat(roll: float, pitch: float, yaw: float) -> np.ndarray:
    cr, sr, cp, sp, cy, sy = math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch), math.cos(yaw), \
        math.sin(yaw)
    return np.array([[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                     [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                     [-sp, cp * sr, cp * cr]])


def rotmat_to_euler(r: np.ndarray) -> tuple[float, float, float]:
    """ZYX angles of a rotation matrix (pitch in [-pi/2, pi/2])."""
    pitch = -math.asin(max(-1.0, min(1.0, float(r[2, 0]))))
    roll = math.atan2(float(r[2, 1]), float(r[2, 2]))
    yaw = math.atan2(float(r[1, 0]), float(r[0, 0]))
    return roll, pitch, yaw


def ned_to_ours(p_ned, v_ned, roll, pitch, yaw, w_frd) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MAVLink telemetry (LOCAL_POSITION_NED, ATTITUDE) -> (position, rotation body->world, velocity, body rates)."""
    r = T @ euler_to_rotmat(roll, pitch, yaw) @ T
    return T @ np.asarray(p_ned, float), r, T @ np.asarray(v_ned, float), T @ np.asarray(w_frd, float)


def ours_to_ned(p, r, v, w) -> tuple[np.ndarray, tuple[float, float, float], np.ndarray, np.ndarray]:
    """The inverse: (position NED, (roll, pitch, yaw), velocity NED, body rates FRD)."""
    return T @ np.asarray(p, float), rotmat_to_euler(T @ np.asarray(r, float) @ T), T @ np.asarray(v, float), \
        T @ np.asarray(w, float)


def quat_to_rotmat(q) -> np.ndarray:
    """(w, x, y, z) -> rotation matrix."""
    w, x, y, z = (float(c) for c in q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
