"""The ``splat`` sim backend: a batch of cars (kinematic bicycle) driving in Gaussian-splat scenes, with the route
geometry (centreline tracking, obstacle boxes, collisions) and the cameras mounted on each car.

Each env drives in one scene of the backend's list (``scene_of[i]``); rendering groups envs by scene and draws
every camera of the group in one kernel call. Geometry is torch on the backend's device; rendering runs the numba
kernel on CPU tensors and the plain-torch reference on CUDA (``render.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from embodied.core.base import resolve_device
from embodied.core.registry import SIM_BACKENDS
from embodied.sim_backends.base import BackendFactory, SimBackend
from embodied.sim_backends.splat.procedural import Route
from embodied.sim_backends.splat.render import SplatScene
from embodied.sim_backends.splat.scene import GaussianScene
from embodied.sim_backends.splat.vehicle import CONTROLS, STATE, VehicleParams, bicycle_step, body_circles

SKY = (0.62, 0.75, 0.92)


@dataclass(frozen=True)
class CameraSpec:
    """A camera fixed to the car: position from the rear axle (forward, left, up) [m], yaw (left +) and pitch
    (up +) [deg], horizontal field of view [deg], image size."""

    name: str = "front"
    forward: float = 1.8
    left: float = 0.0
    up: float = 1.5
    yaw: float = 0.0
    pitch: float = -4.0
    hfov: float = 90.0
    width: int = 112
    height: int = 64


class RouteSet:
    """Centrelines and obstacle boxes of several scenes as padded tensors."""

    def __init__(self, routes: list[Route], device: torch.device):
        m = max(len(r.centerline) for r in routes)
        pts = np.zeros((len(routes), m, 2), np.float32)
        self.num_points = torch.tensor([len(r.centerline) for r in routes], device=device)
        o = max([len(r.obstacles) for r in routes] + [1])
        boxes = np.zeros((len(routes), o, 5), np.float32)  # x, y, yaw, half length, half width
        mask = np.zeros((len(routes), o), bool)
        for i, r in enumerate(routes):
            c = np.asarray(r.centerline, np.float32)
            pts[i, :len(c)], pts[i, len(c):] = c, c[-1]
            for j, ob in enumerate(r.obstacles):
                boxes[i, j] = [ob["center"][0], ob["center"][1], ob.get("yaw", 0.0), ob["size"][0] / 2,
                               ob["size"][1] / 2]
                mask[i, j] = True
        self.points = torch.as_tensor(pts, device=device)  # [S, M, 2]
        seg = self.points[:, 1:] - self.points[:, :-1]
        seglen = seg.norm(dim=-1)
        self.seg_len = torch.cat([seglen, torch.zeros_like(seglen[:, :1])], 1)  # [S, M] (0 past the end)
        self.arc = torch.cat([torch.zeros_like(seglen[:, :1]), seglen.cumsum(1)], 1)  # [S, M]
        tangent = torch.cat([seg, seg[:, -1:]], 1)
        self.heading = torch.atan2(tangent[..., 1], tangent[..., 0])  # [S, M]
        self.length = self.arc.gather(1, (self.num_points - 1)[:, None]).squeeze(1)  # [S]
        self.half_width = torch.tensor([0.5 * r.lanes * r.lane_width for r in routes], device=device)
        self.boxes = torch.as_tensor(boxes, device=device)
        self.box_mask = torch.as_tensor(mask, device=device)

    def track(self, xy: torch.Tensor, scene: torch.Tensor, hint: torch.Tensor, back: int = 8, ahead: int = 24):
        """Nearest centreline segment in a window around ``hint``: ``(index, arc [m], lateral [m, left +],
        heading [rad])`` for positions ``xy [N, 2]``."""
        m = self.points.shape[1]
        window = (hint[:, None] - back + torch.arange(back + ahead + 1, device=xy.device)).clamp(0, m - 2)
        pts = self.points[scene[:, None], window]  # [N, W, 2]
        i = window.gather(1, (pts - xy[:, None]).square().sum(-1).argmin(1, keepdim=True)).squeeze(1)
        # the nearer of the segments ending and starting at point i
        best = None
        for j in (i - 1, i):
            j = j.clamp(0, m - 2)
            a, b = self.points[scene, j], self.points[scene, j + 1]
            d = b - a
            t = (((xy - a) * d).sum(-1) / d.square().sum(-1).clamp_min(1e-9)).clamp(0, 1)
            foot = a + t[:, None] * d
            dist2 = (xy - foot).square().sum(-1)
            cand = (j, t, d, dist2, a)
            best = cand if best is None else tuple(torch.where(dist2 < best[3], c, o) if c.dim() == 1
                                                   else torch.where((dist2 < best[3])[:, None], c, o)
                                                   for c, o in zip(cand, best))
        j, t, d, _, a = best
        arc = self.arc[scene, j] + t * self.seg_len[scene, j]
        tangent = d / d.norm(dim=-1, keepdim=True).clamp_min(1e-9)
        rel = xy - a
        lateral = tangent[:, 0] * rel[:, 1] - tangent[:, 1] * rel[:, 0]
        return j, arc, lateral, torch.atan2(tangent[:, 1], tangent[:, 0])

    def ahead(self, scene: torch.Tensor, index: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
        """Centreline points ``[N, K, 2]`` about ``distances [K]`` metres ahead of point ``index`` (0.5 m steps)."""
        steps = torch.round(distances / 0.5).long()
        j = torch.minimum(index[:, None] + steps, self.num_points[scene][:, None] - 1)
        return self.points[scene[:, None], j]

    def pose_at(self, scene: torch.Tensor, arc: torch.Tensor, lateral: torch.Tensor) -> torch.Tensor:
        """World pose ``[..., 3]`` (x, y, heading) at arc length ``arc [N, M]`` and lateral offset (left +) along
        the centreline of each env's scene ``scene [N]``."""
        arcs = self.arc[scene]  # [N, P]
        last = (self.num_points[scene] - 2)[:, None]
        j = (torch.searchsorted(arcs.contiguous(), arc.contiguous(), right=True) - 1).clamp(min=0)
        j = torch.minimum(j, last)
        t = ((arc - arcs.gather(1, j)) / self.seg_len[scene].gather(1, j).clamp_min(1e-9)).clamp(0, 1)
        pts = self.points[scene]  # [N, P, 2]
        a = pts.gather(1, j[..., None].expand(-1, -1, 2))
        b = pts.gather(1, (j + 1)[..., None].expand(-1, -1, 2))
        h = self.heading[scene].gather(1, j)
        centre = a + t[..., None] * (b - a)
        return torch.stack([centre[..., 0] - torch.sin(h) * lateral, centre[..., 1] + torch.cos(h) * lateral, h], -1)

    def obstacle_clearance(self, x: torch.Tensor, scene: torch.Tensor, p: VehicleParams,
                           extra: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` smallest distance [m] between the car's body circles and any obstacle box (<= 0: collision);
        ``extra [N, M, 5]``: more boxes per env (moving cars)."""
        centres, radius = body_circles(x, p)  # [N, C, 2]
        boxes, mask = self.boxes[scene], self.box_mask[scene]  # [N, O, 5], [N, O]
        if extra is not None and extra.shape[1]:
            boxes = torch.cat([boxes, extra], 1)
            mask = torch.cat([mask, torch.ones(extra.shape[:2], dtype=torch.bool, device=mask.device)], 1)
        rel = centres[:, :, None, :] - boxes[:, None, :, :2]  # [N, C, O, 2]
        c, s = torch.cos(boxes[..., 2])[:, None], torch.sin(boxes[..., 2])[:, None]
        lx, ly = c * rel[..., 0] + s * rel[..., 1], -s * rel[..., 0] + c * rel[..., 1]
        qx = (lx.abs() - boxes[..., 3][:, None]).clamp_min(0)
        qy = (ly.abs() - boxes[..., 4][:, None]).clamp_min(0)
        dist = torch.sqrt(qx * qx + qy * qy) - radius
        dist = torch.where(mask[:, None], dist, torch.full_like(dist, 1e3))
        return dist.amin(dim=(1, 2))


def camera_views(x: torch.Tensor, cam: CameraSpec) -> torch.Tensor:
    """World -> camera (OpenCV) ``[N, 4, 4]`` for camera ``cam`` on cars with state ``x [N, 6]``."""
    yaw = x[:, 2]
    c, s = torch.cos(yaw), torch.sin(yaw)
    pos = torch.stack([x[:, 0] + c * cam.forward - s * cam.left, x[:, 1] + s * cam.forward + c * cam.left,
                       torch.full_like(yaw, cam.up)], -1)
    cy, pitch = yaw + math.radians(cam.yaw), math.radians(cam.pitch)
    fwd = torch.stack([torch.cos(cy) * math.cos(pitch), torch.sin(cy) * math.cos(pitch),
                       torch.full_like(cy, math.sin(pitch))], -1)
    right = torch.stack([torch.sin(cy), -torch.cos(cy), torch.zeros_like(cy)], -1)
    down = torch.linalg.cross(fwd, right)
    rot = torch.stack([right, down, fwd], 1)  # rows: camera axes in the world
    view = torch.zeros(x.shape[0], 4, 4, dtype=x.dtype, device=x.device)
    view[:, :3, :3] = rot
    view[:, :3, 3] = -(rot @ pos[:, :, None]).squeeze(-1)
    view[:, 3, 3] = 1.0
    return view


class DriveSim(SimBackend):
    """``num_envs`` cars; state ``x [N, 6]`` (x, y [m], yaw [rad], speed [m/s], steer [rad], accel [m/s^2]);
    controls (steer [rad], accel [m/s^2]) commands."""

    STATE = STATE
    CONTROLS = CONTROLS

    def __init__(self, num_envs: int, device, scenes: list[tuple[GaussianScene, Route]] | None = None,
                 params: VehicleParams | None = None, cameras: tuple[CameraSpec, ...] = (CameraSpec(),),
                 far: float = 40.0, kernel: str = "auto", moving_cars: int = 0):
        self.num_envs, self.device = num_envs, resolve_device(device)
        if scenes is None:  # the generator's default street (scene 1)
            from embodied.sim_backends.splat.procedural import generate

            scenes = [generate(1)]
        self.params = params or VehicleParams()
        self.cameras, self.far, self.kernel = tuple(cameras), float(far), kernel
        self.splats = [_splat_scene(s, self.device) for s, _ in scenes]
        self.routes = RouteSet([r for _, r in scenes], self.device)
        self.x = torch.zeros(num_envs, STATE.dim, device=self.device)
        self.scene = torch.arange(num_envs, device=self.device) % len(scenes)  # scene of each env
        self.hint = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # last tracked centreline index
        # moving cars: per env, (arc [m], lateral [m], speed [m/s]) along the route; geometry and Gaussians
        self.movers = torch.zeros(num_envs, moving_cars, 3, device=self.device)
        self._car = _car_template(moving_cars) if moving_cars else None

    def step(self, controls: torch.Tensor) -> None:
        self.x = bicycle_step(self.x, controls, self.params)
        self.movers = self.advance_movers(self.movers)

    def advance_movers(self, movers: torch.Tensor, scene: torch.Tensor | None = None) -> torch.Tensor:
        """Moving cars one step later: along the route at their speed, stopping 6 m before its end."""
        if not movers.shape[1]:
            return movers
        scene = self.scene if scene is None else scene
        end = (self.routes.length[scene] - 6.0)[:, None]
        arc = torch.minimum(movers[..., 0] + movers[..., 2] * self.params.dt, end)
        speed = torch.where(arc >= end, torch.zeros_like(arc), movers[..., 2])
        return torch.stack([arc, movers[..., 1], speed], -1)

    def mover_boxes(self, movers: torch.Tensor | None = None, scene: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, M, 5]`` (x, y, yaw, half length, half width) of the moving cars."""
        movers = self.movers if movers is None else movers
        scene = self.scene if scene is None else scene
        if not movers.shape[1]:
            return movers.new_zeros(movers.shape[0], 0, 5)
        pose = self.routes.pose_at(scene, movers[..., 0], movers[..., 1])
        half = pose.new_tensor([CAR_SIZE[0] / 2, CAR_SIZE[1] / 2]).expand(*pose.shape[:2], 2)
        return torch.cat([pose, half], -1)

    def set_state_idx(self, env_ids: torch.Tensor, state: torch.Tensor) -> None:
        self.x[env_ids] = state

    def get_state(self) -> dict[str, torch.Tensor]:
        return {"x": self.x.clone(), "scene": self.scene.clone(), "hint": self.hint.clone(),
                "movers": self.movers.clone()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        self.x = state["x"].clone().to(self.device)
        self.scene = state["scene"].clone().to(self.device)
        self.hint = state["hint"].clone().to(self.device)
        self.movers = state["movers"].clone().to(self.device)

    def track(self):
        """Centreline tracking of every car (updates the search hint): ``(index, arc, lateral, heading)``."""
        out = self.routes.track(self.x[:, :2], self.scene, self.hint)
        self.hint = out[0]
        return out

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """RGB in [0, 1] of every camera of ``env_ids`` (all envs if None): ``[K, cameras, 3, H, W]``."""
        from embodied.sim_backends.splat.render import render_views

        ids = torch.arange(self.num_envs, device=self.device) if env_ids is None else env_ids
        first = self.cameras[0]
        if self.device.type == "cpu" and self.kernel in ("auto", "numba"):
            return self._render_merged(ids)
        out = torch.empty(ids.numel(), len(self.cameras), 3, first.height, first.width, device=self.device)
        scene_ids = self.scene[ids]
        for s in torch.unique(scene_ids).tolist():
            rows = (scene_ids == s).nonzero().squeeze(1)
            x = self.x[ids[rows]]
            views = torch.cat([camera_views(x, cam) for cam in self.cameras])  # camera-major
            intr = torch.tensor([_intrinsics(cam) for cam in self.cameras], device=self.device)
            intr = intr.repeat_interleave(rows.numel(), 0)
            rgb = render_views(self.splats[s], views, intr, first.width, first.height, bg=SKY, far=self.far,
                               kernel=self.kernel, dynamic=self._dynamic(ids[rows]))["rgb"]  # [C * K, H, W, 3]
            rgb = rgb.reshape(len(self.cameras), rows.numel(), first.height, first.width, 3)
            out[rows] = rgb.permute(1, 0, 4, 2, 3).to(self.device)
        return out


    def _dynamic(self, ids: torch.Tensor):
        """The moving cars of ``ids`` as the renderer's dynamic Gaussians, camera-major (None without cars)."""
        if self._car is None:
            return None
        local, cov6, op, sh = self._car  # [M, T, 3] per mover slot
        boxes = self.mover_boxes()[ids].cpu()  # [K, M, 5]
        c, s = torch.cos(boxes[..., 2:3]), torch.sin(boxes[..., 2:3])  # [K, M, 1]
        lx, ly, lz = (torch.from_numpy(local[..., i])[None] for i in range(3))
        world = torch.stack([boxes[..., 0:1] + c * lx - s * ly, boxes[..., 1:2] + s * lx + c * ly,
                             lz.expand(ids.numel(), -1, -1)], -1).reshape(ids.numel(), -1, 3)
        return world.repeat(len(self.cameras), 1, 1).float().numpy(), cov6, op, sh

    def _render_merged(self, ids: torch.Tensor) -> torch.Tensor:
        """The numba kernel on every camera of every env in one parallel call (the scenes' arrays merged once)."""
        from embodied.kernels.splat_numba import render_cameras

        if getattr(self, "_merged", None) is None:
            self._merged = _merge([s.numba_arrays() for s in self.splats])
        arrays, ranges = self._merged
        first, k = self.cameras[0], ids.numel()
        x = self.x[ids]
        views = torch.cat([camera_views(x, cam) for cam in self.cameras]).numpy()  # camera-major
        intr = np.repeat(np.array([_intrinsics(cam) for cam in self.cameras], np.float32), k, 0)
        cam_chunks = np.tile(ranges[self.scene[ids].numpy()], (len(self.cameras), 1))
        rgb = render_cameras(*arrays, views, intr, first.width, first.height, 0.01, self.far, 0.005, SKY,
                             cam_chunks, self._dynamic(ids))[0]
        rgb = torch.from_numpy(rgb).reshape(len(self.cameras), k, first.height, first.width, 3)
        return rgb.permute(1, 0, 4, 2, 3)


def _merge(arrays: list[tuple]) -> tuple[tuple, np.ndarray]:
    """Several scenes' kernel arrays as one set (SH padded to the largest degree with zeros, which add nothing) and
    each scene's chunk range ``[S, 2]``."""
    from embodied.kernels.splat_numba import pad_sh

    k = max(a[3].shape[1] for a in arrays)
    sh = [pad_sh(a[3], k) for a in arrays]
    counts = np.cumsum([0] + [a[0].shape[0] for a in arrays])
    offs, ranges, n_chunks = [], [], 0
    for a, base in zip(arrays, counts[:-1]):
        offs.append(a[4][:-1] + base)
        ranges.append([n_chunks, n_chunks + len(a[4]) - 1])
        n_chunks += len(a[4]) - 1
    chunk_off = np.concatenate(offs + [np.array([counts[-1]], np.int64)]).astype(np.int64)
    merged = (np.concatenate([a[0] for a in arrays]), np.concatenate([a[1] for a in arrays]),
              np.concatenate([a[2] for a in arrays]), np.ascontiguousarray(np.concatenate(sh)), chunk_off,
              np.concatenate([a[5] for a in arrays]))
    return merged, np.asarray(ranges, np.int64)


CAR_SIZE = (4.2, 1.8, 1.5)  # [m] moving cars, as the procedural parked ones
CAR_COLOURS = ((0.8, 0.1, 0.1), (0.1, 0.3, 0.8), (0.9, 0.8, 0.1), (0.2, 0.7, 0.3), (0.9, 0.9, 0.9))


def _car_template(slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The Gaussians of a car as the kernel's dynamic arrays: local means per slot ``[M, T, 3]`` (centre of the
    footprint at the origin, facing +x), and the flat ``cov6 [M T, 6]``, opacity, SH of every slot's car (a colour
    per slot). The Gaussians are isotropic, so a yawed car keeps its covariances."""
    from embodied.kernels.splat_numba import cov_upper
    from embodied.sim_backends.splat.procedural import _Builder
    from embodied.sim_backends.splat.reference import covariance3d

    scenes = []
    for i in range(slots):
        b = _Builder(np.random.default_rng(i))
        b.box([0.0, 0.0, 0.0], list(CAR_SIZE), 0.0, CAR_COLOURS[i % len(CAR_COLOURS)], 0.15)
        scenes.append(b.scene())
    local = np.stack([s.means for s in scenes]).astype(np.float32)
    cov = covariance3d(torch.as_tensor(np.concatenate([s.log_scales for s in scenes])),
                       torch.as_tensor(np.concatenate([s.quats for s in scenes])))
    op = torch.sigmoid(torch.as_tensor(np.concatenate([s.opacity_logits for s in scenes]))).numpy()
    return local, cov_upper(cov), op.astype(np.float32), np.concatenate([s.sh for s in scenes]).astype(np.float32)


def _intrinsics(cam: CameraSpec) -> list[float]:
    f = 0.5 * cam.width / math.tan(math.radians(cam.hfov) / 2)
    return [f, f, cam.width / 2, cam.height / 2]


_SPLAT_CACHE: dict = {}


def _splat_scene(scene: GaussianScene, device: torch.device) -> SplatScene:
    """One ``SplatScene`` per (scene object, device) in a process: envs built again reuse the prepared arrays."""
    key = (id(scene), str(device))
    if key not in _SPLAT_CACHE:
        _SPLAT_CACHE[key] = (scene, SplatScene(scene, device))  # the scene is kept alive so its id stays unique
    return _SPLAT_CACHE[key][1]


SIM_BACKENDS.register("splat", BackendFactory("splat", {"car": DriveSim}))
