"""Procedural road scenes as Gaussian splats (issue 10, reference subsystems.md 1.5): a seeded curved two-lane road of
flat Gaussians, dashed centre marks, kerbs, parked cars as boxes of Gaussians, buildings and trees; written as an
INRIA ``.ply`` plus a ``route.json`` (the centreline polyline, lane width and count, obstacle boxes), so a trained
3DGS scene drops in with a hand-drawn route. Scene indices split into train and held-out test scenes
(``split_of``); the same index always gives the same scene.

World frame: x forward along the start of the road, y left, z up; the road surface is z = 0."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from embodied.core.errors import UserError
from embodied.sim_backends.splat.scene import GaussianScene, read_ply, write_ply

HELD_OUT_EVERY = 5  # every 5th scene index is a held-out test scene


@dataclass
class RoadSceneConfig:
    length: float = 100.0  # [m] along the centreline
    lane_width: float = 3.5  # [m]
    lanes: int = 2
    max_curvature: float = 0.03  # [1/m] peak of the sinusoidal curvature profile
    spacing: float = 0.2  # [m] between road-surface Gaussians
    verge_spacing: float = 0.35  # [m] between grass Gaussians beyond the kerbs
    car_step: float = 0.15  # [m] between Gaussians on a car's surface
    building_step: float = 0.35  # [m] between Gaussians on a building's surface
    crown_points: int = 150  # Gaussians per tree crown
    parked_cars: tuple[int, int] = (1, 4)  # per scene, inclusive, at the kerbs (outside a car on the centreline)
    blocking_cars: tuple[int, int] = (0, 0)  # per scene: cars standing across the centreline, to drive around
    buildings: tuple[int, int] = (4, 10)
    trees: tuple[int, int] = (6, 14)


@dataclass
class Route:
    centerline: list[list[float]]  # [[x, y], ...] every 0.5 m
    lane_width: float
    lanes: int
    obstacles: list[dict] = field(default_factory=list)  # {"center": [x, y, z], "size": [l, w, h], "yaw": rad}
    seed: int | None = None
    split: str | None = None

    def save(self, path: Path) -> Path:
        Path(path).write_text(json.dumps(asdict(self), indent=1))
        return Path(path)

    @classmethod
    def load(cls, path: Path) -> Route:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"scene route not found: {path} (a scene is a .ply plus a route.json with its centreline)")
        try:
            d = json.loads(path.read_text())
            route = cls(**d)
            pts = np.asarray(route.centerline, float)
            if pts.ndim != 2 or pts.shape[1] != 2 or pts.shape[0] < 2 or not np.all(np.isfinite(pts)):
                raise ValueError("centerline must be >= 2 finite [x, y] points")
            seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
            if not np.allclose(seg, 0.5, atol=0.05):  # procedural routes already are; hand-drawn ones rarely
                route.centerline = resample(pts).round(4).tolist()
            return route
        except (ValueError, TypeError, KeyError) as e:
            raise UserError(f"malformed route {path}: {e}") from None


def resample(points: np.ndarray, step: float = 0.5) -> np.ndarray:
    """A polyline ``[M, 2]`` resampled every ``step`` metres of arc length (repeated points dropped): the spacing
    route tracking, look-ahead and start poses assume, whatever a hand-drawn route.json has."""
    pts = np.asarray(points, float)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    pts = pts[np.r_[True, seg > 1e-6]]
    arc = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(pts, axis=0), axis=1))]
    if arc[-1] < step:
        raise ValueError(f"centerline is {arc[-1]:.2f} m long; it needs at least {step} m")
    s = np.arange(0.0, arc[-1] + 1e-9, step)
    return np.stack([np.interp(s, arc, pts[:, 0]), np.interp(s, arc, pts[:, 1])], 1)


def split_of(index: int) -> str:
    return "test" if index % HELD_OUT_EVERY == 0 else "train"


def scene_indices(split: str, count: int) -> list[int]:
    """The first ``count`` scene indices of a split."""
    if split not in ("train", "test"):
        raise UserError(f"split must be train or test, got {split!r}")
    out, i = [], 0
    while len(out) < count:
        if split_of(i) == split:
            out.append(i)
        i += 1
    return out


def _yaw_quat(yaw: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(yaw / 2), np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2)], 1)


class _Builder:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.parts: list[tuple] = []

    def add(self, means, scales, rgb, opacity, yaw=None):
        means = np.asarray(means, float).reshape(-1, 3)
        n = means.shape[0]
        yaw = np.zeros(n) if yaw is None else np.broadcast_to(np.asarray(yaw, float), (n,))
        rgb = np.clip(np.broadcast_to(np.asarray(rgb, float), (n, 3)) + self.rng.normal(0, 0.03, (n, 3)), 0, 1)
        self.parts.append((means, np.broadcast_to(np.asarray(scales, float), (n, 3)), rgb,
                           np.broadcast_to(np.asarray(opacity, float), (n,)), _yaw_quat(yaw)))

    def box(self, center, size, yaw, rgb, step=0.25):
        """Gaussians on the surface of a yawed box (sides and top)."""
        lx, ly, lz = size
        pts = []
        for u in np.arange(-lx / 2, lx / 2 + 1e-6, step):
            for w in np.arange(0, lz + 1e-6, step):
                pts += [(u, -ly / 2, w), (u, ly / 2, w)]
            for v in np.arange(-ly / 2, ly / 2 + 1e-6, step):
                pts.append((u, v, lz))
        for v in np.arange(-ly / 2, ly / 2 + 1e-6, step):
            for w in np.arange(0, lz + 1e-6, step):
                pts += [(-lx / 2, v, w), (lx / 2, v, w)]
        p = np.asarray(pts, float)
        c, s = math.cos(yaw), math.sin(yaw)
        world = np.stack([center[0] + c * p[:, 0] - s * p[:, 1], center[1] + s * p[:, 0] + c * p[:, 1],
                          center[2] + p[:, 2]], 1)
        self.add(world, (0.6 * step,) * 3, rgb, 0.95, yaw)

    def scene(self) -> GaussianScene:
        means, scales, rgb, op, quats = (np.concatenate(x) for x in zip(*self.parts))
        return GaussianScene.from_rgb(means, scales, rgb, op, quats)


def centerline(cfg: RoadSceneConfig, rng: np.random.Generator, step: float = 0.5) -> np.ndarray:
    """``[M, 3]`` (x, y, heading) every ``step`` m: curvature k(s) = K sin(2 pi s / P + phase)."""
    s = np.arange(0.0, cfg.length + 1e-9, step)
    k = cfg.max_curvature * rng.uniform(0.3, 1.0) * np.sin(2 * np.pi * s / rng.uniform(30, 80) + rng.uniform(0, 6.3))
    heading = np.concatenate([[0.0], np.cumsum(0.5 * (k[1:] + k[:-1]) * step)])
    x = np.concatenate([[0.0], np.cumsum(np.cos(0.5 * (heading[1:] + heading[:-1])) * step)])
    y = np.concatenate([[0.0], np.cumsum(np.sin(0.5 * (heading[1:] + heading[:-1])) * step)])
    return np.stack([x, y, heading], 1)


class _Road:
    """Points along the centerline: at arc positions (indices into the line, fractional) and lateral offsets."""

    def __init__(self, line: np.ndarray):
        self.xs, self.ys, self.hs = line[:, 0], line[:, 1], line[:, 2]

    def at(self, frac_along: np.ndarray, offset: np.ndarray):
        xs, ys, hs = self.xs, self.ys, self.hs
        i = np.clip(frac_along, 0, len(xs) - 1)
        i0 = np.floor(i).astype(int)
        i1 = np.minimum(i0 + 1, len(xs) - 1)
        t = i - i0
        px = xs[i0] * (1 - t) + xs[i1] * t
        py = ys[i0] * (1 - t) + ys[i1] * t
        h = hs[i0] * (1 - t) + hs[i1] * t
        return px - np.sin(h) * offset, py + np.cos(h) * offset, h


def _surface(b: _Builder, road: _Road, cfg: RoadSceneConfig, half: float) -> None:
    """Asphalt, dashed lane marks, kerbs and the grass verge."""
    at, n = road.at, len(road.xs)
    along = np.arange(0, n - 1 + 1e-9, cfg.spacing / 0.5)
    across = np.arange(-half + cfg.spacing / 2, half, cfg.spacing)
    a, o = np.meshgrid(along, across, indexing="ij")
    px, py, h = at(a.ravel(), o.ravel())
    b.add(np.stack([px, py, np.zeros_like(px)], 1), (0.6 * cfg.spacing, 0.6 * cfg.spacing, 0.01), (0.25, 0.25, 0.27),
          0.9, h)  # asphalt
    for lane in range(1, cfg.lanes):  # dashed lane marks: 3 m on, 3 m off
        dash = along[(along * 0.5) % 6.0 < 3.0]
        px, py, h = at(dash, np.full_like(dash, -half + lane * cfg.lane_width))
        b.add(np.stack([px, py, np.full_like(px, 0.005)], 1), (0.25, 0.06, 0.005), (0.95, 0.95, 0.9), 0.95, h)
    for side in (-1.0, 1.0):  # kerbs and the verge beyond them
        px, py, h = at(along, np.full_like(along, side * (half + 0.15)))
        b.add(np.stack([px, py, np.full_like(px, 0.08)], 1), (0.2, 0.1, 0.08), (0.7, 0.7, 0.68), 0.95, h)
        verge = np.arange(0, n - 1 + 1e-9, cfg.verge_spacing / 0.5)
        for off in np.arange(half + 0.5, half + 6.0, cfg.verge_spacing):
            px, py, h = at(verge, np.full(len(verge), side * off))
            b.add(np.stack([px, py, np.zeros_like(px)], 1), (0.6 * cfg.verge_spacing,) * 2 + (0.01,), (0.25, 0.45, 0.2),
                  0.9, h)  # grass


def _cars(b: _Builder, road: _Road, cfg: RoadSceneConfig, rng: np.random.Generator, half: float) -> list[dict]:
    """Parked cars in the outer half-lanes, then cars standing in the road at least 20 m apart; their boxes."""
    n, obstacles = len(road.xs), []

    def car(i: float, offset: float, kind: str) -> None:
        px, py, h = road.at(np.array([i]), np.array([offset]))
        center, size = [float(px[0]), float(py[0]), 0.0], [4.2, 1.8, 1.5]
        b.box(center, size, float(h[0]), rng.uniform(0.1, 0.9, 3), cfg.car_step)
        obstacles.append({"center": center, "size": size, "yaw": float(h[0]), "kind": kind})

    for _ in range(rng.integers(cfg.parked_cars[0], cfg.parked_cars[1] + 1)):
        i = rng.uniform(20, n - 10)
        car(i, rng.choice([-1.0, 1.0]) * (half - 0.6), "parked_car")
    spots = np.sort(rng.uniform(30, n - 30, rng.integers(cfg.blocking_cars[0], cfg.blocking_cars[1] + 1)))
    kept = [i for j, i in enumerate(spots) if j == 0 or i - spots[j - 1] > 40]  # at least 20 m apart
    for i in kept:
        car(i, rng.choice([-1.0, 1.0]) * rng.uniform(0.6, 1.2), "blocking_car")
    return obstacles


def _scenery(b: _Builder, road: _Road, cfg: RoadSceneConfig, rng: np.random.Generator, half: float) -> None:
    """Buildings and trees beside the road."""
    n = len(road.xs)
    for _ in range(rng.integers(cfg.buildings[0], cfg.buildings[1] + 1)):
        i, side = rng.uniform(0, n - 1), rng.choice([-1.0, 1.0])
        size = [rng.uniform(6, 14), rng.uniform(5, 10), rng.uniform(4, 12)]
        px, py, h = road.at(np.array([i]), np.array([side * (half + 7.0 + size[1] / 2)]))
        b.box([float(px[0]), float(py[0]), 0.0], size, float(h[0]), rng.uniform(0.4, 0.8, 3) * [1.0, 0.9, 0.8],
              cfg.building_step)
    for _ in range(rng.integers(cfg.trees[0], cfg.trees[1] + 1)):
        i, side = rng.uniform(0, n - 1), rng.choice([-1.0, 1.0])
        px, py, _ = road.at(np.array([i]), np.array([side * (half + rng.uniform(2.0, 5.5))]))
        trunk = np.stack([np.full(6, px[0]), np.full(6, py[0]), np.linspace(0.2, 2.2, 6)], 1)
        b.add(trunk, (0.12, 0.12, 0.25), (0.35, 0.25, 0.15), 0.95)
        crown = np.array([px[0], py[0], 3.2]) + rng.normal(0, 0.7, (cfg.crown_points, 3))
        b.add(crown, (0.3, 0.3, 0.3), (0.15, 0.4, 0.15), 0.8)


def generate(index: int, cfg: RoadSceneConfig | None = None) -> tuple[GaussianScene, Route]:
    """Scene ``index`` (seeded by it): the splats and the route."""
    cfg = cfg or RoadSceneConfig()
    rng = np.random.default_rng(np.random.SeedSequence([20261123, index]))
    b = _Builder(rng)
    line = centerline(cfg, rng)
    half = 0.5 * cfg.lanes * cfg.lane_width
    road = _Road(line)
    _surface(b, road, cfg, half)
    obstacles = _cars(b, road, cfg, rng, half)
    _scenery(b, road, cfg, rng, half)
    route = Route(centerline=line[:, :2].round(4).tolist(), lane_width=cfg.lane_width, lanes=cfg.lanes,
                  obstacles=obstacles, seed=index, split=split_of(index))
    return b.scene(), route


def write_scene(index: int, out_dir: Path, cfg: RoadSceneConfig | None = None) -> Path:
    """``out_dir/scene.ply`` and ``out_dir/route.json`` of scene ``index``."""
    scene, route = generate(index, cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_ply(scene, out_dir / "scene.ply")
    route.save(out_dir / "route.json")
    return out_dir


def load_scene(scene_dir: Path) -> tuple[GaussianScene, Route]:
    """A scene directory (``scene.ply`` + ``route.json``): any trained 3DGS scene with a hand-drawn route drops in."""
    scene_dir = Path(scene_dir)
    route = Route.load(scene_dir / "route.json")
    return read_ply(scene_dir / "scene.ply"), route
