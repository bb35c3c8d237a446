"""Gaussian-splat rendering on the CPU, numba: projection, SH colour, culling, depth sort, tile binning and
compositing fused per camera, parallel over cameras (``render_cameras``); and the compositing stage alone with the
plain-torch reference's signature (``composite``, tested against ``sim_backends/splat/raster_reference.py``).

Semantics are the reference's (``sim_backends/splat/reference.py: project`` and ``raster_reference.composite``):
a Gaussian is drawn on the pixels whose centres lie in its per-axis 3-sigma box, front to back, with the INRIA
stops (power > 0, alpha < 1/255 skipped; T (1 - alpha) < 1e-4 stops the pixel).

Why it is fast on two cores (profile of the first version, pixel-outer like ``renderCUDA``: 28 ms per 112x64 frame
at 20k Gaussians, nearly all in the pixel loop walking tile lists of ~1000 Gaussians that mostly miss the pixel):
the tile loop runs Gaussian-outer, visiting only the pixels of the Gaussian's box inside the tile, with per-pixel
transmittance kept in the tile's scratch and a count of stopped pixels that ends the tile when all are done. The
order per pixel is the same, so the result is the same. Projection and SH are fused in one pass, and one camera is
one task of the parallel loop (batches of cameras keep both cores busy without any synchronization)."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

TILE = 16
ALPHA_MIN = np.float32(1.0 / 255.0)
ALPHA_MAX = np.float32(0.99)
T_MIN = np.float32(1e-4)
EPS2D = np.float32(0.3)
SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154, -0.4570457994644658,
         1.445305721320277, -0.5900435899266435)


@njit(cache=True)
def _sh_rgb(sh, g, x, y, z, basis, out):
    """Colour of Gaussian ``g`` seen along unit direction (x, y, z): the INRIA real-SH sum + 0.5, clamped at 0
    (``basis``: scratch of 16)."""
    k = sh.shape[1]
    basis[0] = SH_C0
    if k > 1:
        basis[1], basis[2], basis[3] = -SH_C1 * y, SH_C1 * z, -SH_C1 * x
    if k > 4:
        xx, yy, zz = x * x, y * y, z * z
        basis[4], basis[5] = SH_C2[0] * x * y, SH_C2[1] * y * z
        basis[6], basis[7], basis[8] = SH_C2[2] * (2 * zz - xx - yy), SH_C2[3] * x * z, SH_C2[4] * (xx - yy)
    if k > 9:
        basis[9], basis[10] = SH_C3[0] * y * (3 * xx - yy), SH_C3[1] * x * y * z
        basis[11], basis[12] = SH_C3[2] * y * (4 * zz - xx - yy), SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy)
        basis[13], basis[14] = SH_C3[4] * x * (4 * zz - xx - yy), SH_C3[5] * z * (xx - yy)
        basis[15] = SH_C3[6] * x * (xx - 3 * yy)
    for ch in range(3):
        s = np.float32(0.5)
        for j in range(k):
            s += basis[j] * sh[g, j, ch]
        out[ch] = max(s, np.float32(0.0))


@njit(cache=True)
def radix_argsort(keys):
    """Stable argsort of non-negative float32 ``keys`` (their bit patterns order like the values): LSD radix
    sort, three passes of 11 bits. 10x faster than ``np.argsort`` on the ~50k depths of one camera."""
    n = keys.shape[0]
    bits = keys.view(np.uint32)
    idx = np.arange(n).astype(np.int32)
    tmp = np.empty(n, np.int32)
    for shift in (0, 11, 22):
        counts = np.zeros(2049, np.int64)
        for i in range(n):
            counts[((bits[idx[i]] >> shift) & 2047) + 1] += 1
        for b in range(2048):
            counts[b + 1] += counts[b]
        for i in range(n):
            j = idx[i]
            b = (bits[j] >> shift) & 2047
            tmp[counts[b]] = j
            counts[b] += 1
        idx, tmp = tmp, idx
    return idx


@njit(cache=True, fastmath=True)
def project_camera(means, cov6, opacity, sh, chunk_off, chunk_sphere, view, intr, width, height, near, far,
                   min_opacity, k0, k1, dmeans, dcov6, dopacity, dsh):
    """EWA projection of the Gaussians of every chunk whose bounding sphere may be seen (in front, nearer than
    ``far``, not beyond the side planes of the frustum) for one camera; returns the visible ones packed front to
    back: ``(data [M, 11], rect [M, 4])`` with data = (u, v, conic a, b, c, opacity, r, g, b, depth, power cut =
    ln(1 / (255 opacity)) less a margin) and rect = the per-axis pixel box (x0, y0, x1, y1) inclusive, clipped
    to the image.

    Chunks ``[k0, k1)`` (``k1 < 0``: to the end) are the camera's scene; ``dmeans [D, 3]`` etc. are this camera's
    dynamic Gaussians (moving cars; D may be 0), drawn after the scene's in the tie order."""
    n = means.shape[0] + dmeans.shape[0]
    fx, fy, cx, cy = intr[0], intr[1], intr[2], intr[3]
    r00, r01, r02, t0 = view[0, 0], view[0, 1], view[0, 2], view[0, 3]
    r10, r11, r12, t1 = view[1, 0], view[1, 1], view[1, 2], view[1, 3]
    r20, r21, r22, t2 = view[2, 0], view[2, 1], view[2, 2], view[2, 3]
    # camera position in the world: -R^T t
    px = -(r00 * t0 + r10 * t1 + r20 * t2)
    py = -(r01 * t0 + r11 * t1 + r21 * t2)
    pz = -(r02 * t0 + r12 * t1 + r22 * t2)
    data = np.empty((n, 11), np.float32)
    rect = np.empty((n, 4), np.int32)
    depth = np.empty(n, np.float32)
    rgb = np.empty(3, np.float32)
    basis = np.empty(16, np.float32)
    # side planes x = +-tx z, y = +-ty z (through the camera), with a 2 px margin for the dilation. A Gaussian
    # (std <= s) whose centre lies d = (x - t z) / sqrt(1 + t^2) beyond a plane still reaches the image when its
    # EWA box, 3 s (fx / z) sqrt(1 + tc^2) with tc clamped to 1.3 tan(fov / 2), does: so a chunk is culled only
    # when x - t z > rad sqrt(1 + max(t, 1.3 tan(fov / 2))^2)
    tx_l, tx_r = (cx + 2.0) / fx, (width - cx + 2.0) / fx
    ty_t, ty_b = (cy + 2.0) / fy, (height - cy + 2.0) / fy
    lx, ly = 1.3 * 0.5 * width / fx, 1.3 * 0.5 * height / fy
    f_l, f_r = np.sqrt(1 + max(tx_l, lx) ** 2), np.sqrt(1 + max(tx_r, lx) ** 2)
    f_t, f_b = np.sqrt(1 + max(ty_t, ly) ** 2), np.sqrt(1 + max(ty_b, ly) ** 2)
    m = 0
    for k in range(k0, chunk_off.shape[0] - 1 if k1 < 0 else k1):  # the chunks of the camera's scene
        sx, sy, sz, rad = chunk_sphere[k, 0], chunk_sphere[k, 1], chunk_sphere[k, 2], chunk_sphere[k, 3]
        cz = r20 * sx + r21 * sy + r22 * sz + t2
        if cz + rad <= near or cz - rad >= far:
            continue
        cxk = r00 * sx + r01 * sy + r02 * sz + t0
        cyk = r10 * sx + r11 * sy + r12 * sz + t1
        if (cxk - tx_r * cz > rad * f_r or -cxk - tx_l * cz > rad * f_l or cyk - ty_b * cz > rad * f_b
                or -cyk - ty_t * cz > rad * f_t):
            continue
        m = _project_range(means, cov6, opacity, sh, chunk_off[k], chunk_off[k + 1], view, fx, fy, cx, cy,
                           width, height, near, far, min_opacity, px, py, pz, data, rect, depth, rgb, basis, m)
    m = _project_range(dmeans, dcov6, dopacity, dsh, 0, dmeans.shape[0], view, fx, fy, cx, cy, width, height, near,
                       far, min_opacity, px, py, pz, data, rect, depth, rgb, basis, m)
    order = radix_argsort(depth[:m])  # stable: ties keep the scene's order, as the reference's stable sort
    return data[order], rect[order]


@njit(cache=True, fastmath=True)
def _project_range(means, cov6, opacity, sh, start, stop, view, fx, fy, cx, cy, width, height, near, far,
                   min_opacity, px, py, pz, data, rect, depth, rgb, basis, m):
    lim_x, lim_y = 1.3 * 0.5 * width / fx, 1.3 * 0.5 * height / fy
    r00, r01, r02, t0 = view[0, 0], view[0, 1], view[0, 2], view[0, 3]
    r10, r11, r12, t1 = view[1, 0], view[1, 1], view[1, 2], view[1, 3]
    r20, r21, r22, t2 = view[2, 0], view[2, 1], view[2, 2], view[2, 3]
    for g in range(start, stop):
        if opacity[g] < min_opacity:
            continue
        mx, my, mz = means[g, 0], means[g, 1], means[g, 2]
        tz = r20 * mx + r21 * my + r22 * mz + t2
        if tz <= near or tz >= far:
            continue
        tx = r00 * mx + r01 * my + r02 * mz + t0
        ty = r10 * mx + r11 * my + r12 * mz + t1
        u = fx * tx / tz + cx
        v = fy * ty / tz + cy
        cxr = min(max(tx / tz, -lim_x), lim_x) * tz
        cyr = min(max(ty / tz, -lim_y), lim_y) * tz
        # M = J W_R (2 x 3)
        j00, j02 = fx / tz, -fx * cxr / (tz * tz)
        j11, j12 = fy / tz, -fy * cyr / (tz * tz)
        m00, m01, m02 = j00 * r00 + j02 * r20, j00 * r01 + j02 * r21, j00 * r02 + j02 * r22
        m10, m11, m12 = j11 * r10 + j12 * r20, j11 * r11 + j12 * r21, j11 * r12 + j12 * r22
        s00, s01, s02, s11, s12, s22 = cov6[g, 0], cov6[g, 1], cov6[g, 2], cov6[g, 3], cov6[g, 4], cov6[g, 5]
        # S M^T columns
        a0 = s00 * m00 + s01 * m01 + s02 * m02
        a1 = s01 * m00 + s11 * m01 + s12 * m02
        a2 = s02 * m00 + s12 * m01 + s22 * m02
        b0 = s00 * m10 + s01 * m11 + s02 * m12
        b1 = s01 * m10 + s11 * m11 + s12 * m12
        b2 = s02 * m10 + s12 * m11 + s22 * m12
        ca = m00 * a0 + m01 * a1 + m02 * a2 + EPS2D
        cb = m00 * b0 + m01 * b1 + m02 * b2
        cc = m10 * b0 + m11 * b1 + m12 * b2 + EPS2D
        det = ca * cc - cb * cb
        if det <= 0:
            continue
        rx = np.float32(3.0) * np.sqrt(ca)
        ry = np.float32(3.0) * np.sqrt(cc)
        if u + rx <= 0 or u - rx >= width or v + ry <= 0 or v - ry >= height:
            continue
        # pixels whose centre k + 0.5 lies in [u - rx, u + rx]
        x0 = max(int(np.ceil(u - rx - 0.5)), 0)
        x1 = min(int(np.floor(u + rx - 0.5)), width - 1)
        y0 = max(int(np.ceil(v - ry - 0.5)), 0)
        y1 = min(int(np.floor(v + ry - 0.5)), height - 1)
        if x1 < x0 or y1 < y0:
            continue
        dx, dy, dz = mx - px, my - py, mz - pz
        inv = 1.0 / np.sqrt(dx * dx + dy * dy + dz * dz)
        _sh_rgb(sh, g, dx * inv, dy * inv, dz * inv, basis, rgb)
        data[m, 0], data[m, 1] = u, v
        data[m, 2], data[m, 3], data[m, 4] = cc / det, -cb / det, ca / det
        data[m, 5] = opacity[g]
        data[m, 6], data[m, 7], data[m, 8] = rgb[0], rgb[1], rgb[2]
        data[m, 9] = tz
        data[m, 10] = np.log(ALPHA_MIN / opacity[g]) - np.float32(1e-4)  # power below it: alpha < 1/255
        rect[m, 0], rect[m, 1], rect[m, 2], rect[m, 3] = x0, y0, x1, y1
        depth[m] = tz
        m += 1
    return m


@njit(cache=True)
def bin_tiles(rect, width, height):
    """Per-tile offsets ``[T + 1]`` and Gaussian ids (in the given, front-to-back order) from pixel boxes."""
    tiles_x, tiles_y = (width + TILE - 1) // TILE, (height + TILE - 1) // TILE
    n_tiles = tiles_x * tiles_y
    counts = np.zeros(n_tiles + 1, np.int64)
    for g in range(rect.shape[0]):
        for ty in range(rect[g, 1] // TILE, rect[g, 3] // TILE + 1):
            for tx in range(rect[g, 0] // TILE, rect[g, 2] // TILE + 1):
                counts[ty * tiles_x + tx + 1] += 1
    offsets = np.cumsum(counts)
    ids = np.empty(offsets[-1], np.int32)
    fill = offsets[:-1].copy()
    for g in range(rect.shape[0]):
        for ty in range(rect[g, 1] // TILE, rect[g, 3] // TILE + 1):
            for tx in range(rect[g, 0] // TILE, rect[g, 2] // TILE + 1):
                t = ty * tiles_x + tx
                ids[fill[t]] = g
                fill[t] += 1
    return offsets, ids


@njit(cache=True, fastmath=True)
def raster_tile(t, data, rect, offsets, ids, width, height, bg, out_rgb, out_depth, out_alpha):
    """Composite tile ``t`` Gaussian-outer; returns how many (Gaussian, pixel) blends it did."""
    tiles_x = (width + TILE - 1) // TILE
    tx0, ty0 = (t % tiles_x) * TILE, (t // tiles_x) * TILE
    tx1, ty1 = min(tx0 + TILE, width) - 1, min(ty0 + TILE, height) - 1
    tw = tx1 - tx0 + 1
    npix = tw * (ty1 - ty0 + 1)
    tr = np.ones(TILE * TILE, np.float32)
    acc = np.zeros((TILE * TILE, 4), np.float32)
    done = np.zeros(TILE * TILE, np.bool_)
    row_done = np.zeros(TILE, np.int64)  # stopped pixels per row: a full row is skipped whole
    n_done = 0
    blends = 0
    for k in range(offsets[t], offsets[t + 1]):
        g = ids[k]
        u, v = data[g, 0], data[g, 1]
        qa, qb, qc, o, cut = data[g, 2], data[g, 3], data[g, 4], data[g, 5], data[g, 10]
        for py in range(max(rect[g, 1], ty0), min(rect[g, 3], ty1) + 1):
            if row_done[py - ty0] == tw:
                continue
            dy = v - (np.float32(py) + np.float32(0.5))
            row = (py - ty0) * tw - tx0
            for px in range(max(rect[g, 0], tx0), min(rect[g, 2], tx1) + 1):
                i = row + px
                if done[i]:
                    continue
                dx = u - (np.float32(px) + np.float32(0.5))
                power = np.float32(-0.5) * (qa * dx * dx + qc * dy * dy) - qb * dx * dy
                if power > 0 or power < cut:  # cut: the exp below would give alpha < 1/255 anyway
                    continue
                alpha = min(ALPHA_MAX, o * np.exp(power))
                if alpha < ALPHA_MIN:
                    continue
                t_now = tr[i]
                t_next = t_now * (np.float32(1.0) - alpha)
                if t_next < T_MIN:
                    done[i] = True
                    row_done[py - ty0] += 1
                    n_done += 1
                    continue
                w = alpha * t_now
                acc[i, 0] += data[g, 6] * w
                acc[i, 1] += data[g, 7] * w
                acc[i, 2] += data[g, 8] * w
                acc[i, 3] += data[g, 9] * w
                tr[i] = t_next
                blends += 1
        if n_done == npix:
            break
    for py in range(ty0, ty1 + 1):
        for px in range(tx0, tx1 + 1):
            i = (py - ty0) * tw + px - tx0
            t_fin = tr[i]
            out_rgb[py, px, 0] = acc[i, 0] + t_fin * bg[0]
            out_rgb[py, px, 1] = acc[i, 1] + t_fin * bg[1]
            out_rgb[py, px, 2] = acc[i, 2] + t_fin * bg[2]
            out_depth[py, px] = acc[i, 3]
            out_alpha[py, px] = np.float32(1.0) - t_fin
    return blends


@njit(cache=True)
def raster_camera(data, rect, width, height, bg, out_rgb, out_depth, out_alpha):
    offsets, ids = bin_tiles(rect, width, height)
    blends = 0
    for t in range(offsets.shape[0] - 1):
        blends += raster_tile(t, data, rect, offsets, ids, width, height, bg, out_rgb, out_depth, out_alpha)
    return blends


@njit(parallel=True, cache=True)
def _render_cameras(means, cov6, opacity, sh, chunk_off, chunk_sphere, cam_chunks, views, intr, width, height, near,
                    far, min_opacity, bg, dmeans, dcov6, dopacity, dsh, out_rgb, out_depth, out_alpha, stats):
    for c in prange(views.shape[0]):
        data, rect = project_camera(means, cov6, opacity, sh, chunk_off, chunk_sphere, views[c], intr[c], width,
                                    height, near, far, min_opacity, cam_chunks[c, 0], cam_chunks[c, 1], dmeans[c],
                                    dcov6, dopacity, dsh)
        stats[c, 0] = data.shape[0]
        stats[c, 1] = raster_camera(data, rect, width, height, bg, out_rgb[c], out_depth[c], out_alpha[c])


@njit(parallel=True, cache=True)
def _composite_tiles(data, rect, offsets, ids, width, height, bg, out_rgb, out_depth, out_alpha):
    for t in prange(offsets.shape[0] - 1):
        raster_tile(t, data, rect, offsets, ids, width, height, bg, out_rgb, out_depth, out_alpha)


def pad_sh(sh: np.ndarray, k: int) -> np.ndarray:
    """SH coefficients ``[N, K', 3]`` padded with zeros to ``K`` (a lower degree: the extra terms add nothing)."""
    return np.ascontiguousarray(np.concatenate([sh, np.zeros((sh.shape[0], k - sh.shape[1], 3), np.float32)], 1))


def cov_upper(cov3: torch.Tensor) -> np.ndarray:
    """``[N, 3, 3]`` symmetric -> ``[N, 6]`` float32 (xx, xy, xz, yy, yz, zz)."""
    i, j = (0, 0, 0, 1, 1, 2), (0, 1, 2, 1, 2, 2)
    return np.ascontiguousarray(cov3[:, i, j].detach().cpu().numpy(), np.float32)


def chunk_scene(means: np.ndarray, scales: np.ndarray, cell: float = 4.0) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """Group Gaussians into ``cell`` x ``cell`` m columns of the xy plane for culling: ``(order [N], offsets
    [K + 1], spheres [K, 4])``; ``order`` is a stable permutation (the scene is kept in it), each chunk's sphere
    (centre, radius) holds the 3-sigma extent of every Gaussian in it."""
    key = np.floor(means[:, :2] / cell).astype(np.int64)
    key = (key[:, 0] - key[:, 0].min()) * (key[:, 1].max() - key[:, 1].min() + 1) + key[:, 1] - key[:, 1].min()
    order = np.argsort(key, kind="stable")
    k_sorted = key[order]
    starts = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])
    offsets = np.r_[starts, len(order)].astype(np.int64)
    spheres = np.empty((len(starts), 4), np.float32)
    m, ext = means[order].astype(np.float64), 3.0 * scales[order].max(1)
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        c = 0.5 * (m[a:b].min(0) + m[a:b].max(0))
        spheres[i, :3], spheres[i, 3] = c, (np.linalg.norm(m[a:b] - c, axis=1) + ext[a:b]).max() + 1e-3
    return order, offsets, spheres


def render_cameras(means, cov6, opacity, sh, chunk_off, chunk_sphere, views, intr, width: int, height: int,
                   near: float, far: float, min_opacity: float, bg=(0.0, 0.0, 0.0), cam_chunks=None, dynamic=None):
    """Render C cameras of one size: ``views [C, 4, 4]`` world -> camera, ``intr [C, 4]`` (fx, fy, cx, cy), scene
    arrays as numpy float32 (``cov6`` from ``cov_upper``), chunks from ``chunk_scene``. Returns ``rgb [C, H, W,
    3]``, ``depth``, ``alpha`` ``[C, H, W]`` and ``stats [C, 2]`` (visible Gaussians, blends).

    ``cam_chunks [C, 2]``: the range of chunks each camera sees (several scenes merged into one set of arrays, one
    scene per camera); None: all. ``dynamic``: ``(means [C, D, 3], cov6 [D, 6], opacity [D], sh [D, K, 3])``,
    Gaussians that move per camera (cars)."""
    c = views.shape[0]
    out_rgb = np.empty((c, height, width, 3), np.float32)
    out_depth = np.empty((c, height, width), np.float32)
    out_alpha = np.empty((c, height, width), np.float32)
    stats = np.zeros((c, 2), np.int64)
    if cam_chunks is None:
        cam_chunks = np.tile(np.array([0, len(chunk_off) - 1], np.int64), (c, 1))
    if dynamic is None:
        dynamic = (np.zeros((c, 0, 3), np.float32), np.zeros((0, 6), np.float32), np.zeros(0, np.float32),
                   np.zeros((0, sh.shape[1], 3), np.float32))
    dmeans, dcov6, dop, dsh = (np.ascontiguousarray(a, np.float32) for a in dynamic)
    if dsh.shape[1] != sh.shape[1]:
        k = max(dsh.shape[1], sh.shape[1])
        sh, dsh = pad_sh(sh, k), pad_sh(dsh, k)
    _render_cameras(means, cov6, opacity, sh, chunk_off, chunk_sphere, np.ascontiguousarray(cam_chunks, np.int64),
                    np.ascontiguousarray(views, np.float32),
                    np.ascontiguousarray(intr, np.float32), int(width), int(height), np.float32(near),
                    np.float32(far), np.float32(min_opacity), np.asarray(bg, np.float32), dmeans, dcov6, dop, dsh,
                    out_rgb, out_depth, out_alpha, stats)
    return out_rgb, out_depth, out_alpha, stats


def composite(means2d, conic, opacity, rgb, depth, radius, valid, width: int, height: int, bg=(0.0, 0.0, 0.0)):
    """The compositing stage alone, with the reference's signature (float32 tensors on the CPU)."""
    order = torch.argsort(torch.where(valid, depth, torch.full_like(depth, float("inf"))), stable=True)
    order = order[valid[order]]
    m, r = means2d[order].float(), radius[order].float()  # the box in float32, as the fused kernel
    x0 = torch.ceil(m[:, 0] - r[:, 0] - 0.5).clamp_min(0)
    x1 = torch.floor(m[:, 0] + r[:, 0] - 0.5).clamp_max(width - 1)
    y0 = torch.ceil(m[:, 1] - r[:, 1] - 0.5).clamp_min(0)
    y1 = torch.floor(m[:, 1] + r[:, 1] - 0.5).clamp_max(height - 1)
    keep = (x1 >= x0) & (y1 >= y0)
    cut = torch.log(ALPHA_MIN / opacity[order, None].float()) - 1e-4
    data = torch.cat([means2d[order], conic[order], opacity[order, None], rgb[order], depth[order, None], cut],
                     1)[keep]
    rect = torch.stack([x0, y0, x1, y1], 1)[keep]
    data = np.ascontiguousarray(data.detach().cpu().numpy(), np.float32)
    rect = np.ascontiguousarray(rect.cpu().numpy(), np.int32)
    offsets, ids = bin_tiles(rect, width, height)
    out_rgb = np.empty((height, width, 3), np.float32)
    out_depth = np.empty((height, width), np.float32)
    out_alpha = np.empty((height, width), np.float32)
    _composite_tiles(data, rect, offsets, ids, width, height, np.asarray(bg, np.float32), out_rgb, out_depth,
                     out_alpha)
    return torch.from_numpy(out_rgb), torch.from_numpy(out_depth), torch.from_numpy(out_alpha)
