"""Gaussian-splat scenes and the standard INRIA ``.ply`` format (reference subsystems.md 1.1-1.2).

A scene holds N Gaussians with their stored (pre-activation) parameters: means ``[N, 3]``, log-scales ``[N, 3]``,
quaternions ``[N, 4]`` (w, x, y, z; not necessarily normalized), opacity logits ``[N]`` and spherical-harmonics
colour coefficients ``[N, K, 3]`` with ``K = (degree + 1)^2``.

The ``.ply`` is read by property *name* (any order, extra properties ignored, any numeric type), so any trained
3DGS scene drops in; ``f_rest_*`` is channel-major on disk (``f_rest[c (K-1) + k - 1]`` is coefficient k of colour
channel c) and its count gives the SH degree (0, 9, 24, 45 -> 0..3). A file lacking a required property is one
``UserError`` line naming it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embodied.core.errors import UserError

C0 = 0.28209479177387814
REQUIRED = ("x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
            "rot_0", "rot_1", "rot_2", "rot_3")
REST_COUNTS = {0: 0, 9: 1, 24: 2, 45: 3}  # number of f_rest_* properties -> SH degree


@dataclass
class GaussianScene:
    means: np.ndarray  # [N, 3] float32, world frame [m]
    log_scales: np.ndarray  # [N, 3]
    quats: np.ndarray  # [N, 4] (w, x, y, z)
    opacity_logits: np.ndarray  # [N]
    sh: np.ndarray  # [N, K, 3]

    def __post_init__(self):
        n = self.means.shape[0]
        for name, shape in (("means", (n, 3)), ("log_scales", (n, 3)), ("quats", (n, 4)), ("opacity_logits", (n,))):
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {shape}")
        k = self.sh.shape[1] if self.sh.ndim == 3 else 0
        if self.sh.shape != (n, k, 3) or k not in (1, 4, 9, 16):
            raise ValueError(f"sh has shape {self.sh.shape}, expected [N, (degree+1)^2, 3] with degree 0-3")

    @property
    def num(self) -> int:
        return self.means.shape[0]

    @property
    def sh_degree(self) -> int:
        return int(round(self.sh.shape[1] ** 0.5)) - 1

    @classmethod
    def from_rgb(cls, means, scales, rgb, opacity, quats=None) -> GaussianScene:
        """A scene from activated values: scales [m], colours in [0, 1], opacities in (0, 1) (SH degree 0)."""
        means = np.asarray(means, np.float32)
        n = means.shape[0]
        op = np.clip(np.asarray(opacity, np.float64).reshape(n), 1e-6, 1 - 1e-6)
        q = np.tile([1.0, 0.0, 0.0, 0.0], (n, 1)) if quats is None else np.asarray(quats)
        return cls(means, np.log(np.asarray(scales, np.float64)).astype(np.float32), q.astype(np.float32),
                   np.log(op / (1 - op)).astype(np.float32),
                   ((np.asarray(rgb, np.float64).reshape(n, 1, 3) - 0.5) / C0).astype(np.float32))


def _rest_names(degree: int) -> list[str]:
    return [f"f_rest_{i}" for i in range(3 * ((degree + 1) ** 2 - 1))]


def write_ply(scene: GaussianScene, path: Path) -> Path:
    """INRIA layout, binary little-endian float32, properties in the order the reference implementation writes."""
    from plyfile import PlyData, PlyElement

    n, k = scene.num, scene.sh.shape[1]
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", *_rest_names(scene.sh_degree),
             "opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    rest = scene.sh[:, 1:, :].transpose(0, 2, 1).reshape(n, 3 * (k - 1))  # channel-major
    cols = np.concatenate([scene.means, np.zeros((n, 3), np.float32), scene.sh[:, 0, :], rest,
                           scene.opacity_logits[:, None], scene.log_scales, scene.quats], axis=1).astype(np.float32)
    data = np.empty(n, dtype=[(name, "f4") for name in names])
    for i, name in enumerate(names):
        data[name] = cols[:, i]
    path = Path(path)
    PlyData([PlyElement.describe(data, "vertex")], byte_order="<").write(str(path))
    return path


def read_ply(path: Path) -> GaussianScene:
    from plyfile import PlyData

    path = Path(path)
    try:
        ply = PlyData.read(str(path))
        v = ply["vertex"]
    except FileNotFoundError:
        raise UserError(f"scene file not found: {path}") from None
    except Exception as e:  # plyfile's PlyParseError, a missing element (KeyError), a truncated file, ...
        raise UserError(f"{path} is not a readable .ply with a 'vertex' element: {e}") from None
    names = set(v.data.dtype.names or ())
    missing = [p for p in REQUIRED if p not in names]
    if missing:
        raise UserError(f"{path} lacks the Gaussian-splat propert{'y' if len(missing) == 1 else 'ies'} "
                        f"{', '.join(missing)} (the INRIA 3DGS .ply layout)")
    rest = sorted((p for p in names if p.startswith("f_rest_")), key=lambda p: int(p.rsplit("_", 1)[1]))
    if len(rest) not in REST_COUNTS or rest != _rest_names(REST_COUNTS.get(len(rest), 0)):
        raise UserError(f"{path} has {len(rest)} f_rest_* properties; a 3DGS scene has 0, 9, 24 or 45 "
                        "(SH degree 0-3), numbered from 0")
    degree = REST_COUNTS[len(rest)]
    n, k = len(v.data), (degree + 1) ** 2

    def cols(props):
        if not props:
            return np.zeros((n, 0), np.float32)
        return np.stack([np.asarray(v[p], np.float32) for p in props], axis=1)

    sh = np.empty((n, k, 3), np.float32)
    sh[:, 0, :] = cols(["f_dc_0", "f_dc_1", "f_dc_2"])
    if k > 1:
        sh[:, 1:, :] = cols(rest).reshape(n, 3, k - 1).transpose(0, 2, 1)
    return GaussianScene(cols(["x", "y", "z"]), cols(["scale_0", "scale_1", "scale_2"]),
                         cols(["rot_0", "rot_1", "rot_2", "rot_3"]), np.asarray(v["opacity"], np.float32), sh)
