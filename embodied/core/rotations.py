"""Quaternion algebra, batched. Convention: (w, x, y, z), Hamilton product, unit quaternions
rotate body -> world: v_w = q (x) (0, v_b) (x) q*."""

from __future__ import annotations

import torch


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product ``a (x) b``; ``[..., 4]``."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        -1,
    )


def quat_conj(q: torch.Tensor) -> torch.Tensor:
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def quat_rotate(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate ``v [..., 3]`` by unit ``q [..., 4]``."""
    qv = torch.cat([torch.zeros_like(v[..., :1]), v], -1)
    return quat_mul(quat_mul(q, qv), quat_conj(q))[..., 1:]


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrix ``[..., 3, 3]`` of unit ``q [..., 4]`` (columns: body axes in world)."""
    w, x, y, z = q.unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        -1,
    ).reshape(*q.shape[:-1], 3, 3)


def quat_from_axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """``axis [..., 3]`` (unit), ``angle [...]`` [rad] -> ``[..., 4]``."""
    half = 0.5 * angle
    return torch.cat([torch.cos(half)[..., None], axis * torch.sin(half)[..., None]], -1)


def random_unit_vectors(n: int, generator: torch.Generator, device) -> torch.Tensor:
    v = torch.randn(n, 3, generator=generator, device=device)
    return v / v.norm(dim=1, keepdim=True).clamp_min(1e-9)


def tilt_angle(q: torch.Tensor) -> torch.Tensor:
    """Angle [rad] between body z and world z: acos(R_zz)."""
    x, y = q[..., 1], q[..., 2]
    return torch.acos((1 - 2 * (x * x + y * y)).clamp(-1.0, 1.0))
