"""Plain-torch reference of depth-sorted alpha compositing (reference subsystems.md 1.4; the INRIA ``renderCUDA``
loop), slow and exact, for testing the kernel (``kernels/splat_numba.py``) against.

Per pixel, front to back over the Gaussians whose box ``|u - x| <= r_x, |v - y| <= r_y`` holds the pixel centre
(x, y) (the kernel bins Gaussians into tiles by the same box, so tiles only speed it up and the tile size changes
nothing; INRIA instead draws a Gaussian on every pixel of the 16x16 tiles its 3-sigma-max square touches):
    power = -0.5 (A dx^2 + C dy^2) - B dx dy            (conic (A, B, C), d = mean2d - pixel centre)
    skip if power > 0;  alpha = min(0.99, o exp(power));  skip if alpha < 1/255
    stop if T (1 - alpha) < 1e-4;  C += rgb alpha T;  D += z alpha T;  T *= 1 - alpha
    out = C + T bg,  depth = D (alpha-weighted),  alpha = 1 - T
"""

from __future__ import annotations

import torch

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.99
T_MIN = 1e-4


def composite(means2d, conic, opacity, rgb, depth, radius, valid, width: int, height: int, bg=(0.0, 0.0, 0.0),
              pixel_block: int | None = None):
    """One camera: ``rgb [H, W, 3]``, ``depth [H, W]``, ``alpha [H, W]`` (float64). ``pixel_block`` bounds memory
    (the ``[pixels, Gaussians]`` matrices) by doing that many pixels at a time; the result is the same."""
    dt = torch.float64
    means2d, conic, opacity, rgb, depth = (t.to(dt) for t in (means2d, conic, opacity, rgb, depth))
    order = torch.argsort(torch.where(valid, depth, torch.full_like(depth, float("inf"))), stable=True)
    order = order[valid[order]]
    m, q, o, c, z = means2d[order], conic[order], opacity[order], rgb[order], depth[order]
    r = radius[order].to(dt)
    dev = means2d.device
    ys, xs = torch.meshgrid(torch.arange(height, dtype=dt, device=dev), torch.arange(width, dtype=dt, device=dev),
                            indexing="ij")
    px, py = xs.reshape(-1) + 0.5, ys.reshape(-1) + 0.5  # [P]
    block = pixel_block or px.shape[0]
    parts = [_pixels(px[i:i + block], py[i:i + block], m, q, o, c, z, r, bg) for i in range(0, px.shape[0], block)]
    color, dep, alpha = (torch.cat(t) for t in zip(*parts))
    return color.reshape(height, width, 3), dep.reshape(height, width), alpha.reshape(height, width)


def _pixels(px, py, m, q, o, c, z, r, bg):
    dt = torch.float64
    dx, dy = m[None, :, 0] - px[:, None], m[None, :, 1] - py[:, None]
    inside = (dx.abs() <= r[None, :, 0]) & (dy.abs() <= r[None, :, 1])  # [P, N]
    power = -0.5 * (q[None, :, 0] * dx * dx + q[None, :, 2] * dy * dy) - q[None, :, 1] * dx * dy
    alpha = torch.clamp(o[None, :] * torch.exp(power), max=ALPHA_MAX)
    use = inside & (power <= 0) & (alpha >= ALPHA_MIN)
    alpha = torch.where(use, alpha, torch.zeros_like(alpha))
    t_after = torch.cumprod(1 - alpha, dim=1)
    t_before = torch.cat([torch.ones_like(t_after[:, :1]), t_after[:, :-1]], 1)
    # T only falls: the first Gaussian that would take it below T_MIN stops the pixel, and so do all after it
    live = t_after >= T_MIN
    w = torch.where(live, alpha * t_before, torch.zeros_like(alpha))
    t_final = torch.where(live, t_after, torch.ones_like(t_after)).min(1).values if w.shape[1] else torch.ones(
        px.shape[0], dtype=dt, device=px.device)
    color = w @ c + t_final[:, None] * torch.as_tensor(bg, dtype=dt, device=px.device)
    return color, w @ z, 1 - t_final
