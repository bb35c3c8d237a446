"""Plain-torch reference of ``kernels/mesh_raster_numba.render`` (same signature, same semantics): every triangle of
every image moved to the world, culled, clipped against the near plane, z-buffered over all pixels at once, then
every pixel shaded (ambient + diffuse + Blinn-Phong specular of the headlight and the model's lights). Written for
clarity, not speed: the tests compare the kernel with it on small images."""

from __future__ import annotations

import numpy as np
import torch

NEAR = 0.01


def _clip(wv: torch.Tensor, vc: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The triangle's part in front of the near plane, as 0-2 triangles (world and camera-frame vertices)."""
    poly_w, poly_c = [], []
    for k in range(3):
        k2 = (k + 1) % 3
        da, db = float(-vc[k, 2] - NEAR), float(-vc[k2, 2] - NEAR)
        if da >= 0:
            poly_w.append(wv[k])
            poly_c.append(vc[k])
        if (da >= 0) != (db >= 0):
            s = da / (da - db)
            poly_w.append(wv[k] + s * (wv[k2] - wv[k]))
            poly_c.append(vc[k] + s * (vc[k2] - vc[k]))
    return [(torch.stack([poly_w[0], poly_w[i], poly_w[i + 1]]), torch.stack([poly_c[0], poly_c[i], poly_c[i + 1]]))
            for i in range(1, len(poly_w) - 1)]


def _shade(p, n, view, base, spec, shininess, ambient, lights, head):
    """``p, n, view: [P, 3]``, ``base [P, 3]`` -> colours ``[P, 3]`` (see the kernel's ``_shade``)."""
    colour = base * ambient
    spec_sum = torch.zeros(p.shape[0])
    sources = [(-head[:3].expand_as(p), torch.ones(p.shape[0]), head[3:6], head[6])]
    for light in lights:
        if light[13] < 0.5:
            continue
        if light[10] > 0.5:
            to_light, spot = -light[3:6].expand_as(p), torch.ones(p.shape[0])
        else:
            to_light = light[:3] - p
            to_light = to_light / to_light.norm(dim=1, keepdim=True)
            cos_a = -(to_light * light[3:6]).sum(1)
            spot = torch.where(cos_a >= light[11], cos_a.clamp_min(0) ** light[12], torch.zeros_like(cos_a))
        sources.append((to_light, spot, light[6:9], light[9]))
    for to_light, spot, diffuse, specular in sources:
        ndl = (n * to_light).sum(1)
        lit = (ndl > 0) & (spot > 0)
        colour = colour + torch.where(lit[:, None], base * diffuse * (ndl * spot)[:, None], torch.zeros_like(base))
        half = to_light + view
        hn = half.norm(dim=1)
        ndh = (n * half).sum(1) / hn.clamp_min(1e-12)
        on = lit & (hn > 0) & (ndh > 0)
        spec_sum = spec_sum + torch.where(on, specular * spec * spot * ndh.clamp_min(0) ** shininess,
                                          torch.zeros_like(ndh))
    return (colour + spec_sum[:, None]).clamp(max=1.0)


def render(tri, tri_geom, tri_rgb, geom_pos, geom_mat, cam_pos, cam_mat, fy, lights, head_light, ambient, spec_mat,
           shininess, background, image, segment) -> None:
    """Fills ``image`` and ``segment`` (numpy, as the kernel's)."""
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    tri, tri_rgb, lights = t(tri), t(tri_rgb), t(lights)
    n_env, n_cam, h, w = image.shape[:4]
    jj, ii = torch.meshgrid(torch.arange(w, dtype=torch.float64) + 0.5, torch.arange(h, dtype=torch.float64) + 0.5,
                            indexing="xy")
    px, py = jj.reshape(-1), ii.reshape(-1)
    for e in range(n_env):
        gp, gm = t(geom_pos[e]), t(geom_mat[e]).reshape(-1, 3, 3)
        world = torch.einsum("tij,tkj->tki", gm[tri_geom], tri) + gp[tri_geom][:, None]  # [T, 3, 3]
        for c in range(n_cam):
            cp, cm = t(cam_pos[e, c]), t(cam_mat[e, c]).reshape(3, 3)
            f = float(fy[c])
            # the drawn triangles in scene order (a clipped one as its parts): world and camera-frame vertices
            drawn_w, drawn_c, drawn_n, drawn_src = [], [], [], []
            vcs = torch.einsum("tki,ij->tkj", world - cp, cm)  # R^T (p - cam) for every vertex
            for k in range(tri.shape[0]):
                wv, vc = world[k], vcs[k]
                if bool((-vc[:, 2] < NEAR).all()):
                    continue
                nrm = torch.linalg.cross(wv[1] - wv[0], wv[2] - wv[0])
                if float(nrm.norm()) <= 0 or float(nrm @ (cp - wv[0])) <= 0:
                    continue
                parts = [(wv, vc)] if bool((-vc[:, 2] >= NEAR).all()) else _clip(wv, vc)
                for pw, pc in parts:
                    drawn_w.append(pw)
                    drawn_c.append(pc)
                    drawn_n.append(nrm / nrm.norm())
                    drawn_src.append(k)
            depth = torch.full((h * w,), float("inf"), dtype=torch.float64)
            ident = torch.full((h * w,), -1, dtype=torch.long)
            point = torch.zeros(h * w, 3, dtype=torch.float64)
            normal = torch.zeros(h * w, 3, dtype=torch.float64)
            if drawn_w:
                dw, dc, dn = torch.stack(drawn_w), torch.stack(drawn_c), torch.stack(drawn_n)
                src = torch.tensor(drawn_src)
                for s0 in range(0, len(dw), 256):  # z-buffer in chunks: the first nearest wins, as in the kernel
                    pw, pc = dw[s0:s0 + 256], dc[s0:s0 + 256]
                    sw = -pc[..., 2]  # [K, 3]
                    sx, sy = w / 2 + f * pc[..., 0] / sw, h / 2 - f * pc[..., 1] / sw
                    area = (sx[:, 1] - sx[:, 0]) * (sy[:, 2] - sy[:, 0]) - (sx[:, 2] - sx[:, 0]) * (sy[:, 1] - sy[:, 0])
                    a = torch.where(area == 0, torch.ones_like(area), area)[:, None]
                    b0 = ((sx[:, 1:2] - px) * (sy[:, 2:3] - py) - (sx[:, 2:3] - px) * (sy[:, 1:2] - py)) / a
                    b1 = ((sx[:, 2:3] - px) * (sy[:, 0:1] - py) - (sx[:, 0:1] - px) * (sy[:, 2:3] - py)) / a
                    b2 = 1 - b0 - b1
                    q = torch.stack([b0, b1, b2], -1) / sw[:, None, :]  # [K, P, 3]
                    d = 1 / q.sum(-1)
                    inside = (b0 >= 0) & (b1 >= 0) & (b2 >= 0) & (area != 0)[:, None]
                    d = torch.where(inside, d, torch.full_like(d, float("inf")))
                    best, arg = d.min(0)
                    hit = best < depth
                    rows = torch.arange(h * w)
                    lam = q[arg, rows] * best[:, None]
                    depth = torch.where(hit, best, depth)
                    ident = torch.where(hit, src[s0 + arg], ident)
                    point = torch.where(hit[:, None], (lam[:, :, None] * pw[arg]).sum(1), point)
                    normal = torch.where(hit[:, None], dn[s0 + arg], normal)
            out = torch.as_tensor(np.asarray(background), dtype=torch.float64).expand(h * w, 3).clone()
            hit = ident >= 0
            if bool(hit.any()):
                head = t(head_light[c]).clone()
                head[:3] = -cm[:, 2]
                view = cp - point[hit]
                view = view / view.norm(dim=1, keepdim=True)
                out[hit] = _shade(point[hit], normal[hit], view, tri_rgb[ident[hit]], float(spec_mat),
                                  float(shininess), float(ambient), lights, head)
            image[e, c] = (out * 255 + 0.5).clamp(0, 255).to(torch.uint8).reshape(h, w, 3).numpy()
            segment[e, c] = torch.where(hit, torch.as_tensor(tri_geom, dtype=torch.long)[ident.clamp_min(0)],
                                        torch.full_like(ident, -1)).reshape(h, w).numpy()
