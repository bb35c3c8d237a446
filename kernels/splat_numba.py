"""Tile-binned alpha compositing of projected Gaussians, numba, parallel over 16x16 tiles; the plain-torch
reference with the same signature and semantics is ``sim_backends/splat/raster_reference.py: composite``.

Gaussians are sorted by depth once, then binned per tile in that order (a counting pass and a fill pass), so every
tile's list is already front to back; each pixel walks its tile's list with the INRIA early stops."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

TILE = 16
ALPHA_MIN = np.float32(1.0 / 255.0)
ALPHA_MAX = np.float32(0.99)
T_MIN = np.float32(1e-4)


@njit(cache=True)
def _bin(rect, tiles_x, tiles_y):
    """``rect [N, 4]`` tile ranges (depth order) -> per-tile offsets ``[T + 1]`` and Gaussian ids, front to back."""
    n_tiles = tiles_x * tiles_y
    counts = np.zeros(n_tiles + 1, np.int64)
    for g in range(rect.shape[0]):
        for ty in range(rect[g, 1], rect[g, 3]):
            for tx in range(rect[g, 0], rect[g, 2]):
                counts[ty * tiles_x + tx + 1] += 1
    offsets = np.cumsum(counts)
    ids = np.empty(offsets[-1], np.int64)
    fill = offsets[:-1].copy()
    for g in range(rect.shape[0]):
        for ty in range(rect[g, 1], rect[g, 3]):
            for tx in range(rect[g, 0], rect[g, 2]):
                t = ty * tiles_x + tx
                ids[fill[t]] = g
                fill[t] += 1
    return offsets, ids


@njit(parallel=True, cache=True)
def _raster(m, q, o, c, z, offsets, ids, width, height, tiles_x, bg, out_rgb, out_depth, out_alpha):
    n_tiles = offsets.shape[0] - 1
    for t in prange(n_tiles):
        tx0, ty0 = (t % tiles_x) * TILE, (t // tiles_x) * TILE
        start, stop = offsets[t], offsets[t + 1]
        for py in range(ty0, min(ty0 + TILE, height)):
            for px in range(tx0, min(tx0 + TILE, width)):
                cx, cy = np.float32(px + 0.5), np.float32(py + 0.5)
                tr = np.float32(1.0)
                r = np.float32(0.0)
                gch = np.float32(0.0)
                b = np.float32(0.0)
                d = np.float32(0.0)
                for k in range(start, stop):
                    g = ids[k]
                    dx, dy = m[g, 0] - cx, m[g, 1] - cy
                    power = np.float32(-0.5) * (q[g, 0] * dx * dx + q[g, 2] * dy * dy) - q[g, 1] * dx * dy
                    if power > 0:
                        continue
                    alpha = min(ALPHA_MAX, o[g] * np.exp(power))
                    if alpha < ALPHA_MIN:
                        continue
                    t_next = tr * (np.float32(1.0) - alpha)
                    if t_next < T_MIN:
                        break
                    w = alpha * tr
                    r += c[g, 0] * w
                    gch += c[g, 1] * w
                    b += c[g, 2] * w
                    d += z[g] * w
                    tr = t_next
                out_rgb[py, px, 0] = r + tr * bg[0]
                out_rgb[py, px, 1] = gch + tr * bg[1]
                out_rgb[py, px, 2] = b + tr * bg[2]
                out_depth[py, px] = d
                out_alpha[py, px] = np.float32(1.0) - tr


def composite(means2d, conic, opacity, rgb, depth, radius, valid, width: int, height: int, bg=(0.0, 0.0, 0.0)):
    """Same signature and outputs as the reference (float32 tensors on the CPU)."""
    from embodied.sim_backends.splat.raster_reference import tile_rects

    order = torch.argsort(torch.where(valid, depth, torch.full_like(depth, float("inf"))), stable=True)
    order = order[valid[order]]

    def f32(t):
        return np.ascontiguousarray(t[order].detach().cpu().numpy(), np.float32)

    m, q, o, c, z = f32(means2d), f32(conic), f32(opacity), f32(rgb), f32(depth)
    rect = np.ascontiguousarray(tile_rects(means2d[order], radius[order], width, height).cpu().numpy(), np.int64)
    tiles_x, tiles_y = (width + TILE - 1) // TILE, (height + TILE - 1) // TILE
    offsets, ids = _bin(rect, tiles_x, tiles_y)
    out_rgb = np.empty((height, width, 3), np.float32)
    out_depth = np.empty((height, width), np.float32)
    out_alpha = np.empty((height, width), np.float32)
    _raster(m, q, o, c, z, offsets, ids, width, height, tiles_x, np.asarray(bg, np.float32), out_rgb, out_depth,
            out_alpha)
    return torch.from_numpy(out_rgb), torch.from_numpy(out_depth), torch.from_numpy(out_alpha)
