"""Batched triangle rasterization on the CPU, numba: every (env, camera) image of a batch is one task of a parallel
loop; each task transforms the scene's triangles by its env's geom poses, projects them through its camera,
z-buffers them at pixel centres and shades every pixel like MuJoCo's renderer (ambient + diffuse + Blinn-Phong
specular from the model's lights and the camera's headlight, spot cones with their exponent; no shadows, no
reflections, no anti-aliasing). The plain-torch reference with the same signature and semantics is
``sim_backends/mujoco_cpu/raster_reference.py``; ``sim_backends/mujoco_cpu/batch_render.py`` builds the inputs.

Conventions (MuJoCo's): a camera looks along its frame's -z with +y up; ``cam_mat`` and ``geom_mat`` are row-major
3x3 rotations (world <- local); pixel ``(row, col)`` samples the image plane at its centre; ``fy`` = (H / 2) /
tan(fovy / 2) in pixels. Back faces (against the triangle's winding, which is outward) are culled."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embodied.kernels.copy_numba import copy1

NEAR = np.float32(0.01)  # [m] triangles with a vertex nearer than this (or behind the camera) are skipped


@njit(cache=True, fastmath=True)
def _shade(p, n, view, base, spec_mat, shininess, amb, lights, head):
    """Colour at world point ``p`` with unit normal ``n`` facing the viewer, unit ``view`` (to the eye).
    ``lights [L, 14]``: pos(3), dir(3), diffuse(3), specular(1), directional(1), cos cutoff(1), exponent(1),
    active(1); ``head [7]``: the headlight's forward dir (3), diffuse(3), specular(1) (its light comes from the
    eye)."""
    r = base[0] * amb
    g = base[1] * amb
    b = base[2] * amb
    sr = np.float32(0.0)
    # the headlight: a directional light along the camera's forward axis
    ldx, ldy, ldz = -head[0], -head[1], -head[2]
    ndl = n[0] * ldx + n[1] * ldy + n[2] * ldz
    if ndl > 0:
        r += base[0] * head[3] * ndl
        g += base[1] * head[4] * ndl
        b += base[2] * head[5] * ndl
        hx, hy, hz = ldx + view[0], ldy + view[1], ldz + view[2]
        hn = np.sqrt(hx * hx + hy * hy + hz * hz)
        if hn > 0:
            ndh = (n[0] * hx + n[1] * hy + n[2] * hz) / hn
            if ndh > 0:
                sr += head[6] * spec_mat * ndh ** shininess
    for li in range(lights.shape[0]):
        if lights[li, 13] < 0.5:
            continue
        if lights[li, 10] > 0.5:  # directional
            ldx, ldy, ldz = -lights[li, 3], -lights[li, 4], -lights[li, 5]
            spot = np.float32(1.0)
        else:
            ldx, ldy, ldz = lights[li, 0] - p[0], lights[li, 1] - p[1], lights[li, 2] - p[2]
            d = np.sqrt(ldx * ldx + ldy * ldy + ldz * ldz)
            ldx, ldy, ldz = ldx / d, ldy / d, ldz / d
            cos_a = -(ldx * lights[li, 3] + ldy * lights[li, 4] + ldz * lights[li, 5])
            if cos_a < lights[li, 11]:
                continue
            spot = cos_a ** lights[li, 12]
        ndl = n[0] * ldx + n[1] * ldy + n[2] * ldz
        if ndl <= 0:
            continue
        r += base[0] * lights[li, 6] * ndl * spot
        g += base[1] * lights[li, 7] * ndl * spot
        b += base[2] * lights[li, 8] * ndl * spot
        hx, hy, hz = ldx + view[0], ldy + view[1], ldz + view[2]
        hn = np.sqrt(hx * hx + hy * hy + hz * hz)
        if hn > 0:
            ndh = (n[0] * hx + n[1] * hy + n[2] * hz) / hn
            if ndh > 0:
                sr += lights[li, 9] * spec_mat * spot * ndh ** shininess
    return min(r + sr, 1.0), min(g + sr, 1.0), min(b + sr, 1.0)


@njit(cache=True, fastmath=True)
def _raster(sx, sy, sw, d_id, depth, tri_id, lam, w, h):
    """z-buffer one screen-space triangle (vertices ``sx, sy``, view depths ``sw``) as drawn triangle ``d_id``:
    where it is nearest, the pixel keeps its id and perspective-correct barycentrics (of vertices 1 and 2)."""
    area = (sx[1] - sx[0]) * (sy[2] - sy[0]) - (sx[2] - sx[0]) * (sy[1] - sy[0])
    if area == 0:
        return
    x0 = max(int(np.floor(min(sx[0], sx[1], sx[2]))), 0)
    x1 = min(int(np.ceil(max(sx[0], sx[1], sx[2]))), w - 1)
    y0 = max(int(np.floor(min(sy[0], sy[1], sy[2]))), 0)
    y1 = min(int(np.ceil(max(sy[0], sy[1], sy[2]))), h - 1)
    if x0 > x1 or y0 > y1:
        return
    inv_area = np.float32(1.0) / area
    iw0, iw1, iw2 = np.float32(1.0) / sw[0], np.float32(1.0) / sw[1], np.float32(1.0) / sw[2]
    for i in range(y0, y1 + 1):
        py = np.float32(i) + np.float32(0.5)
        for j in range(x0, x1 + 1):
            px = np.float32(j) + np.float32(0.5)
            b0 = ((sx[1] - px) * (sy[2] - py) - (sx[2] - px) * (sy[1] - py)) * inv_area
            b1 = ((sx[2] - px) * (sy[0] - py) - (sx[0] - px) * (sy[2] - py)) * inv_area
            b2 = np.float32(1.0) - b0 - b1
            if b0 < 0 or b1 < 0 or b2 < 0:
                continue
            q0, q1, q2 = b0 * iw0, b1 * iw1, b2 * iw2
            inv = q0 + q1 + q2
            d = np.float32(1.0) / inv
            if d >= depth[i, j]:
                continue
            depth[i, j] = d
            tri_id[i, j] = d_id
            lam[i, j, 0] = q1 * d
            lam[i, j, 1] = q2 * d


@njit(cache=True, parallel=True, fastmath=True)
def render(tri, tri_geom, tri_rgb, geom_pos, geom_mat, cam_pos, cam_mat, fy, lights, head_light, ambient,
           spec_mat, shininess, background, image, segment):
    """Render ``image [N, C, H, W, 3]`` (uint8) and ``segment [N, C, H, W]`` (int32: the geom index seen, -1 none).

    ``tri [T, 3, 3]`` float32: triangle vertices in their geom's frame; ``tri_geom [T]``: the geom of each;
    ``tri_rgb [T, 3]``; ``geom_pos [N, G, 3]``, ``geom_mat [N, G, 9]``; ``cam_pos [N, C, 3]``, ``cam_mat [N, C, 9]``;
    ``fy [C]``; ``head_light [C, 7]`` (see ``_shade``; its direction is filled per camera here), ``background [3]``.

    Per image: every triangle is moved to the world, culled when it faces away, clipped against the near plane
    (a triangle crossing it becomes one or two), and z-buffered (ids and barycentrics per pixel); then every
    covered pixel is shaded once (deferred: no shading of hidden surfaces)."""
    n_env, n_cam, h, w = image.shape[0], image.shape[1], image.shape[2], image.shape[3]
    n_tri = tri.shape[0]
    for job in prange(n_env * n_cam):
        e = job // n_cam
        c = job % n_cam
        depth = np.full((h, w), np.inf, dtype=np.float32)
        tri_id = np.full((h, w), -1, dtype=np.int32)
        lam = np.zeros((h, w, 2), dtype=np.float32)
        drawn_w = np.empty((2 * n_tri, 3, 3), dtype=np.float32)  # world vertices of the drawn (clipped) triangles
        drawn_src = np.empty(2 * n_tri, dtype=np.int32)  # the scene triangle each came from
        drawn_n = np.empty((2 * n_tri, 3), dtype=np.float32)
        n_drawn = 0
        cp = cam_pos[e, c]
        cm = cam_mat[e, c]
        f = fy[c]
        cx, cy = np.float32(w) * 0.5, np.float32(h) * 0.5
        wv = np.empty((3, 3), dtype=np.float32)
        vc = np.empty((3, 3), dtype=np.float32)  # camera-frame vertices
        poly_w = np.empty((4, 3), dtype=np.float32)  # the clipped polygon: world and camera-frame vertices
        poly_c = np.empty((4, 3), dtype=np.float32)
        sx = np.empty(3, dtype=np.float32)
        sy = np.empty(3, dtype=np.float32)
        sw = np.empty(3, dtype=np.float32)
        for t in range(n_tri):
            g = tri_geom[t]
            gp = geom_pos[e, g]
            gm = geom_mat[e, g]
            n_front = 0
            for k in range(3):
                lx, ly, lz = tri[t, k, 0], tri[t, k, 1], tri[t, k, 2]
                x = gm[0] * lx + gm[1] * ly + gm[2] * lz + gp[0]
                y = gm[3] * lx + gm[4] * ly + gm[5] * lz + gp[1]
                z = gm[6] * lx + gm[7] * ly + gm[8] * lz + gp[2]
                wv[k, 0], wv[k, 1], wv[k, 2] = x, y, z
                dx, dy, dz = x - cp[0], y - cp[1], z - cp[2]
                vc[k, 0] = cm[0] * dx + cm[3] * dy + cm[6] * dz  # R^T (p - cam)
                vc[k, 1] = cm[1] * dx + cm[4] * dy + cm[7] * dz
                vc[k, 2] = cm[2] * dx + cm[5] * dy + cm[8] * dz
                if -vc[k, 2] >= NEAR:
                    n_front += 1
            if n_front == 0:
                continue
            # the face normal (outward by the winding); a face turned away from the camera is culled
            ax, ay, az = wv[1, 0] - wv[0, 0], wv[1, 1] - wv[0, 1], wv[1, 2] - wv[0, 2]
            bx, by, bz = wv[2, 0] - wv[0, 0], wv[2, 1] - wv[0, 1], wv[2, 2] - wv[0, 2]
            nx, ny, nz = ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx
            nn = np.sqrt(nx * nx + ny * ny + nz * nz)
            if nn <= 0:
                continue
            if nx * (cp[0] - wv[0, 0]) + ny * (cp[1] - wv[0, 1]) + nz * (cp[2] - wv[0, 2]) <= 0:
                continue
            # clip against the near plane (-z >= NEAR): Sutherland-Hodgman on one plane, 3 or 4 vertices out
            m = 0
            for k in range(3):
                k2 = (k + 1) % 3
                da, db = -vc[k, 2] - NEAR, -vc[k2, 2] - NEAR
                if da >= 0:
                    copy1(poly_w[m], wv[k])
                    copy1(poly_c[m], vc[k])
                    m += 1
                if (da >= 0) != (db >= 0):
                    s = da / (da - db)
                    for q in range(3):
                        poly_w[m, q] = wv[k, q] + s * (wv[k2, q] - wv[k, q])
                        poly_c[m, q] = vc[k, q] + s * (vc[k2, q] - vc[k, q])
                    m += 1
            for fan in range(1, m - 1):  # the polygon as a fan of triangles
                for q, k in enumerate((0, fan, fan + 1)):
                    copy1(drawn_w[n_drawn, q], poly_w[k])
                    sw[q] = -poly_c[k, 2]
                    sx[q] = cx + f * poly_c[k, 0] / sw[q]
                    sy[q] = cy - f * poly_c[k, 1] / sw[q]
                drawn_src[n_drawn] = t
                drawn_n[n_drawn, 0], drawn_n[n_drawn, 1], drawn_n[n_drawn, 2] = nx / nn, ny / nn, nz / nn
                _raster(sx, sy, sw, n_drawn, depth, tri_id, lam, w, h)
                n_drawn += 1
        # deferred shading: each covered pixel once
        head = head_light[c].copy()
        head[0], head[1], head[2] = -cm[2], -cm[5], -cm[8]  # the camera's forward axis (its -z) in the world
        pw = np.empty(3, dtype=np.float32)
        view = np.empty(3, dtype=np.float32)
        seg = segment[e, c]
        img = image[e, c]
        bg0 = np.uint8(background[0] * 255.0 + 0.5)
        bg1 = np.uint8(background[1] * 255.0 + 0.5)
        bg2 = np.uint8(background[2] * 255.0 + 0.5)
        for i in range(h):
            for j in range(w):
                d_id = tri_id[i, j]
                if d_id < 0:
                    seg[i, j] = -1
                    img[i, j, 0], img[i, j, 1], img[i, j, 2] = bg0, bg1, bg2
                    continue
                t = drawn_src[d_id]
                seg[i, j] = tri_geom[t]
                l1, l2 = lam[i, j, 0], lam[i, j, 1]
                l0 = np.float32(1.0) - l1 - l2
                for q in range(3):
                    pw[q] = l0 * drawn_w[d_id, 0, q] + l1 * drawn_w[d_id, 1, q] + l2 * drawn_w[d_id, 2, q]
                vx, vy, vz = cp[0] - pw[0], cp[1] - pw[1], cp[2] - pw[2]
                vn = np.sqrt(vx * vx + vy * vy + vz * vz)
                view[0], view[1], view[2] = vx / vn, vy / vn, vz / vn
                r, gg, bb = _shade(pw, drawn_n[d_id], view, tri_rgb[t], spec_mat, shininess, ambient, lights, head)
                img[i, j, 0] = np.uint8(r * 255.0 + 0.5)
                img[i, j, 1] = np.uint8(gg * 255.0 + 0.5)
                img[i, j, 2] = np.uint8(bb * 255.0 + 0.5)
