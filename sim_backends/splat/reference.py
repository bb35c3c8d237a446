"""Plain-torch reference of the splat math (reference subsystems.md 1.2-1.3): activations, 3D covariance,
spherical-harmonics colour with the INRIA constants, and the EWA projection to screen-space conics. Batched over
Gaussians, any device; the fast kernel under ``kernels/`` is tested against it.

Camera: ``viewmat`` is world -> camera in the OpenCV convention (+x right, +y down, +z forward); intrinsics
``fx, fy, cx, cy`` in pixels; pixel (i, j) covers [j, j+1) x [i, i+1), so its centre is (j + 0.5, i + 0.5) (gsplat's
convention)."""

from __future__ import annotations

import math

import torch

C0 = 0.28209479177387814
C1 = 0.4886025119029199
C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154, -0.4570457994644658,
      1.445305721320277, -0.5900435899266435)
EPS2D = 0.3  # [px^2] low-pass dilation of every screen-space covariance


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    """``[N, 4]`` (w, x, y, z), normalized here -> ``[N, 3, 3]``."""
    w, x, y, z = torch.nn.functional.normalize(q, dim=-1).unbind(-1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)


def covariance3d(log_scales: torch.Tensor, quats: torch.Tensor, scale_modifier: float = 1.0) -> torch.Tensor:
    """Sigma = R S S^T R^T with S = diag(exp(log_scale) * modifier): ``[N, 3, 3]``."""
    r = quat_to_rotmat(quats)
    m = r * (torch.exp(log_scales) * scale_modifier)[:, None, :]  # R S
    return m @ m.transpose(1, 2)


def sh_basis(dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """The real SH basis the INRIA renderer evaluates, ``[N, (degree + 1)^2]`` at unit directions ``[N, 3]``."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, C0)]
    if degree >= 1:
        out += [-C1 * y, C1 * z, -C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [C2[0] * x * y, C2[1] * y * z, C2[2] * (2 * zz - xx - yy), C2[3] * x * z, C2[4] * (xx - yy)]
    if degree >= 3:
        out += [C3[0] * y * (3 * xx - yy), C3[1] * x * y * z, C3[2] * y * (4 * zz - xx - yy),
                C3[3] * z * (2 * zz - 3 * xx - 3 * yy), C3[4] * x * (4 * zz - xx - yy), C3[5] * z * (xx - yy),
                C3[6] * x * (xx - 3 * yy)]
    return torch.stack(out, -1)


def sh_to_rgb(sh: torch.Tensor, means: torch.Tensor, campos: torch.Tensor) -> torch.Tensor:
    """``rgb = max(0, sum_k c_k Y_k(dir) + 0.5)``, dir = normalize(mean - camera position): ``[N, 3]``."""
    degree = int(round(sh.shape[1] ** 0.5)) - 1
    dirs = torch.nn.functional.normalize(means - campos, dim=-1)
    return ((sh_basis(dirs, degree)[:, :, None] * sh).sum(1) + 0.5).clamp_min(0.0)


def project(means: torch.Tensor, cov3: torch.Tensor, viewmat: torch.Tensor, fx: float, fy: float, cx: float,
            cy: float, width: int, height: int, near: float = 0.01, far: float = 1e10) -> dict[str, torch.Tensor]:
    """EWA splatting of 3D Gaussians to screen space.

        t = W mu + T;  t_x, t_y clamped to +-1.3 tan(fov/2) t_z for the Jacobian only
        J = [[fx / t_z, 0, -fx t_x / t_z^2], [0, fy / t_z, -fy t_y / t_z^2]]
        Sigma2 = J W_R Sigma3 W_R^T J^T + 0.3 I;  conic = Sigma2^-1 as (a, b, c) of [[a, b], [b, c]]
        radius = (3 sqrt(Sigma2_xx), 3 sqrt(Sigma2_yy))   per axis, in pixels (gsplat >= 1.5 has per-axis
                 radii too; INRIA uses one integer radius ceil(3 sqrt(lambda_max)) for both axes, a square much
                 too large for the flat road Gaussians a driving camera sees edge-on)
        mean2d = (fx t_x / t_z + cx, fy t_y / t_z + cy)

    A Gaussian contributes to the pixels whose centres lie in its box ``|u - x| <= r_x, |v - y| <= r_y``: it holds
    the whole 3-sigma ellipse. Returns ``means2d [N, 2]``, ``conic [N, 3]``, ``radius [N, 2]``, ``depth [N]``
    (t_z), ``valid [N]`` (in front, within ``[near, far]``, det > 0, box on screen)."""
    rot, trans = viewmat[:3, :3], viewmat[:3, 3]
    t = means @ rot.T + trans
    tz = t[:, 2]
    tan_x, tan_y = 0.5 * width / fx, 0.5 * height / fy
    lim_x, lim_y = 1.3 * tan_x, 1.3 * tan_y
    safe_z = tz.clamp_min(1e-6)
    tx = safe_z * (t[:, 0] / safe_z).clamp(-lim_x, lim_x)
    ty = safe_z * (t[:, 1] / safe_z).clamp(-lim_y, lim_y)
    zeros = torch.zeros_like(tz)
    jac = torch.stack([fx / safe_z, zeros, -fx * tx / safe_z ** 2, zeros, fy / safe_z, -fy * ty / safe_z ** 2],
                      -1).reshape(-1, 2, 3)
    m = jac @ rot
    cov2 = m @ cov3 @ m.transpose(1, 2)
    a, b, c = cov2[:, 0, 0] + EPS2D, cov2[:, 0, 1], cov2[:, 1, 1] + EPS2D
    det = a * c - b * b
    safe_det = torch.where(det > 0, det, torch.ones_like(det))
    conic = torch.stack([c / safe_det, -b / safe_det, a / safe_det], -1)
    rx, ry = 3.0 * torch.sqrt(a.clamp_min(0)), 3.0 * torch.sqrt(c.clamp_min(0))
    u = fx * t[:, 0] / safe_z + cx
    v = fy * t[:, 1] / safe_z + cy
    valid = (tz > near) & (tz < far) & (det > 0)
    valid &= (u + rx > 0) & (u - rx < width) & (v + ry > 0) & (v - ry < height)
    radius = torch.stack([rx, ry], -1)
    return {"means2d": torch.stack([u, v], -1), "conic": conic, "radius": radius, "depth": tz,
            "valid": valid}


def look_at(campos, target, up=(0.0, 0.0, 1.0)) -> torch.Tensor:
    """World -> camera (OpenCV) for a camera at ``campos`` looking at ``target``: ``[4, 4]``."""
    campos, target, up = (torch.as_tensor(v, dtype=torch.float64) for v in (campos, target, up))
    fwd = torch.nn.functional.normalize(target - campos, dim=0)
    right = torch.nn.functional.normalize(torch.linalg.cross(fwd, up), dim=0)
    down = torch.linalg.cross(fwd, right)
    rot = torch.stack([right, down, fwd])  # rows: camera axes in world coordinates
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3], view[:3, 3] = rot, -rot @ campos
    return view.float()


def fov_to_focal(fov_rad: float, pixels: int) -> float:
    return 0.5 * pixels / math.tan(0.5 * fov_rad)
