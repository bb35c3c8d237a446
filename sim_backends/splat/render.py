"""Rendering a Gaussian-splat scene from batched cameras: RGB, alpha-weighted depth and accumulated alpha.

``SplatScene`` holds the activated, static parts of a scene as tensors on one device (means, 3D covariances,
opacities, SH coefficients), computed once; ``render(scene, cameras)`` projects (torch, any device), colours by SH
from each camera's position, culls by opacity and distance, and composites with the numba kernel on CPU
(``kernel="auto"|"numba"``) or the plain-torch reference (``kernel="torch"``, the CUDA path)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embodied.core.base import resolve_device
from embodied.core.errors import UserError
from embodied.sim_backends.splat import raster_reference
from embodied.sim_backends.splat.reference import covariance3d, project, sh_to_rgb
from embodied.sim_backends.splat.scene import GaussianScene


@dataclass
class Camera:
    viewmat: torch.Tensor  # [4, 4] world -> camera (OpenCV: +x right, +y down, +z forward)
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int

    @property
    def position(self) -> torch.Tensor:
        r, t = self.viewmat[:3, :3], self.viewmat[:3, 3]
        return -(r.T @ t)


class SplatScene:
    """The Gaussians are kept grouped in 4 m x 4 m columns of the xy plane (``chunk_scene``), so the kernel culls
    whole chunks; both kernels see them in that order, which breaks ties in depth."""

    def __init__(self, scene: GaussianScene, device: str | torch.device = "cpu"):
        from embodied.kernels.splat_numba import chunk_scene

        dev = resolve_device(device)
        self.device = dev
        order, self.chunk_off, self.chunk_sphere = chunk_scene(scene.means, np.exp(scene.log_scales))
        self.means = torch.as_tensor(scene.means[order], device=dev)
        self.cov3 = covariance3d(torch.as_tensor(scene.log_scales[order], device=dev),
                                 torch.as_tensor(scene.quats[order], device=dev))
        self.opacity = torch.sigmoid(torch.as_tensor(scene.opacity_logits[order], device=dev))
        self.sh = torch.as_tensor(scene.sh[order], device=dev)
        self._numba = None  # the kernel's float32 numpy copies, made on first use

    def numba_arrays(self):
        if self._numba is None:
            from embodied.kernels.splat_numba import cov_upper

            f32 = lambda t: np.ascontiguousarray(t.detach().cpu().numpy(), np.float32)  # noqa: E731
            self._numba = (f32(self.means), cov_upper(self.cov3), f32(self.opacity), f32(self.sh), self.chunk_off,
                           self.chunk_sphere)
        return self._numba

    @property
    def num(self) -> int:
        return self.means.shape[0]


def render(scene: SplatScene, cameras: list[Camera], bg=(0.0, 0.0, 0.0), near: float = 0.01, far: float = 1e10,
           min_opacity: float = 0.005, kernel: str = "auto") -> dict[str, torch.Tensor]:
    """``rgb [C, H, W, 3]``, ``depth [C, H, W]`` (alpha-weighted), ``alpha [C, H, W]`` for C cameras of one size."""
    if not cameras:
        raise UserError("render needs at least one camera")
    w, h = cameras[0].width, cameras[0].height
    if any((c.width, c.height) != (w, h) for c in cameras):
        raise UserError("all cameras of one render call must have the same image size")
    views = torch.stack([c.viewmat.to(torch.float32) for c in cameras])
    intr = torch.tensor([[c.fx, c.fy, c.cx, c.cy] for c in cameras], dtype=torch.float32)
    return render_views(scene, views, intr, w, h, bg, near, far, min_opacity, kernel)


def render_views(scene: SplatScene, views: torch.Tensor, intr: torch.Tensor, width: int, height: int,
                 bg=(0.0, 0.0, 0.0), near: float = 0.01, far: float = 1e10, min_opacity: float = 0.005,
                 kernel: str = "auto", pixel_block: int | None = 1024, dynamic=None) -> dict[str, torch.Tensor]:
    """``render`` for batched camera tensors: ``views [C, 4, 4]`` world -> camera, ``intr [C, 4]`` (fx, fy, cx,
    cy). ``dynamic``: ``(means [C, D, 3], cov6 [D, 6], opacity [D], sh [D, K, 3])`` numpy float32, Gaussians that
    move per camera (cars), drawn after the scene's in the tie order. Outputs on the scene's device."""
    if kernel not in ("auto", "numba", "torch"):
        raise UserError(f"splat kernel must be auto, numba or torch, got {kernel!r}")
    use_numba = kernel == "numba" or (kernel == "auto" and scene.device.type == "cpu")
    if use_numba and scene.device.type != "cpu":
        raise UserError("the numba splat kernel runs on CPU tensors; use kernel=torch on CUDA")
    if use_numba:
        from embodied.kernels.splat_numba import render_cameras

        rgb, depth, alpha, _ = render_cameras(*scene.numba_arrays(), views.detach().cpu().float().numpy(),
                                              intr.detach().cpu().float().numpy(), width, height, near, far,
                                              min_opacity, bg, dynamic=dynamic)
        return {"rgb": torch.from_numpy(rgb), "depth": torch.from_numpy(depth), "alpha": torch.from_numpy(alpha)}
    outs = []
    dt = scene.means.dtype
    means, cov3, opacity, sh = scene.means, scene.cov3, scene.opacity, scene.sh
    if dynamic is not None:  # what does not depend on the camera, once: covariances, opacities, SH
        d = [torch.as_tensor(a, device=scene.device) for a in dynamic]
        full = torch.zeros(d[1].shape[0], 3, 3, dtype=dt, device=scene.device)
        for col, (a, b) in enumerate(((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))):
            full[:, a, b] = full[:, b, a] = d[1][:, col].to(dt)  # cov6 (xx, xy, xz, yy, yz, zz) -> 3x3
        k = max(scene.sh.shape[1], d[3].shape[1])
        cov3, opacity = torch.cat([scene.cov3, full]), torch.cat([scene.opacity, d[2].to(dt)])
        sh = torch.cat([_pad_sh(scene.sh, k), _pad_sh(d[3].to(dt), k)])
    for c, (view, (fx, fy, cx, cy)) in enumerate(zip(views.to(scene.device, dt), intr.tolist())):
        if dynamic is not None:  # the cars' positions differ per camera
            means = torch.cat([scene.means, d[0][c].to(dt)])
        keep = opacity >= min_opacity
        p = project(means, cov3, view, fx, fy, cx, cy, width, height, near, far)
        campos = -(view[:3, :3].T @ view[:3, 3])
        rgb = sh_to_rgb(sh, means, campos)
        outs.append(raster_reference.composite(p["means2d"], p["conic"], opacity, rgb, p["depth"],
                                               p["radius"], p["valid"] & keep, width, height, bg, pixel_block))
    return {name: torch.stack([o[i].to(scene.device, torch.float32) for o in outs])
            for i, name in enumerate(("rgb", "depth", "alpha"))}


def _pad_sh(sh: torch.Tensor, k: int) -> torch.Tensor:
    """SH coefficients ``[N, K', 3]`` padded with zeros to ``K`` (a lower degree: the extra terms add nothing)."""
    return torch.cat([sh, sh.new_zeros(sh.shape[0], k - sh.shape[1], 3)], 1)
