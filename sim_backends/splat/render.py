"""Rendering a Gaussian-splat scene from batched cameras: RGB, alpha-weighted depth and accumulated alpha.

``SplatScene`` holds the activated, static parts of a scene as tensors on one device (means, 3D covariances,
opacities, SH coefficients), computed once; ``render(scene, cameras)`` projects (torch, any device), colours by SH
from each camera's position, culls by opacity and distance, and composites with the numba kernel on CPU
(``kernel="auto"|"numba"``) or the plain-torch reference (``kernel="torch"``, the CUDA path)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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

        dev = torch.device(device)
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
                 kernel: str = "auto", pixel_block: int | None = 1024) -> dict[str, torch.Tensor]:
    """``render`` for batched camera tensors: ``views [C, 4, 4]`` world -> camera, ``intr [C, 4]`` (fx, fy, cx,
    cy). Outputs on the scene's device."""
    if kernel not in ("auto", "numba", "torch"):
        raise UserError(f"splat kernel must be auto, numba or torch, got {kernel!r}")
    use_numba = kernel == "numba" or (kernel == "auto" and scene.device.type == "cpu")
    if use_numba and scene.device.type != "cpu":
        raise UserError("the numba splat kernel runs on CPU tensors; use kernel=torch on CUDA")
    if use_numba:
        from embodied.kernels.splat_numba import render_cameras

        rgb, depth, alpha, _ = render_cameras(*scene.numba_arrays(), views.detach().cpu().float().numpy(),
                                              intr.detach().cpu().float().numpy(), width, height, near, far,
                                              min_opacity, bg)
        return {"rgb": torch.from_numpy(rgb), "depth": torch.from_numpy(depth), "alpha": torch.from_numpy(alpha)}
    keep = scene.opacity >= min_opacity
    outs = []
    dt = scene.means.dtype
    for view, (fx, fy, cx, cy) in zip(views.to(scene.device, dt), intr.tolist()):
        p = project(scene.means, scene.cov3, view, fx, fy, cx, cy, width, height, near, far)
        campos = -(view[:3, :3].T @ view[:3, 3])
        rgb = sh_to_rgb(scene.sh, scene.means, campos)
        outs.append(raster_reference.composite(p["means2d"], p["conic"], scene.opacity, rgb, p["depth"],
                                               p["radius"], p["valid"] & keep, width, height, bg, pixel_block))
    return {name: torch.stack([o[i].to(scene.device, torch.float32) for o in outs])
            for i, name in enumerate(("rgb", "depth", "alpha"))}
