"""Driving in Gaussian-splat road scenes (issue 10): ``drive-lane-keep`` and ``drive-avoid``.

A kinematic car (``sim_backends/splat/vehicle.py``) follows the route of a procedural street (or any scene directory
with a ``scene.ply`` and a ``route.json``) from camera images (default: one front camera, 64x112) plus its speed and
steering angle; or, with ``observation=state``, from route geometry in its own frame (the fast variant for tests and
a privileged upper reference). The critic always sees the privileged state.

Reward: the GSDrive terms (reference subsystems.md 1.6), per step: survival, proximity to the path, progress along
it [m], alignment with it (these three scaled by speed / ``bonus_speed``, capped at 1: standing still earns nothing),
approach (the change of the distance to the path, x1.5 when it shrinks, floored), comfort
(acceleration and jerk beyond 2 m/s^2 and 5 m/s^3), and penalties when a collision or leaving the road ends the
episode; arriving at the end of the route is paid the per-step bonuses of the steps left (GSDrive's episodes have a
fixed length, ours end at the goal: without it, crawling for the whole time limit pays as much as driving).

With ``probing=true`` GSDrive's multi-mode trajectory probing scores the state by ``Phi = max_k future_k``:
from the current state, each of K fixed anchor manoeuvres is rolled ``probe_steps`` steps on the geometry (nothing
is rendered, the sim is not touched) and scored with the probe terms. GSDrive adds ``probe_weight * Phi`` to every
step (``probe_mode=additive``); its episodes have a fixed length, ours end at the end of the route, and there that
reward pays for staying on the road longer than needed (measured: the first probing run learned to crawl, 3% route
completion where the plain run drives 100%). The default, ``probe_mode=potential``, adds it as potential-based
shaping, ``probe_weight * (gamma Phi(s') - Phi(s))`` with ``Phi = 0`` at termination, which keeps the optimal
policy of the task (Ng, Harada and Russell 1999) and still rewards moving toward states whose probes look good.
Episodes end at the end of the route (success), in a collision or off the road (failure), or at the time limit."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

import gymnasium as gym
import numpy as np
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms, box
from embodied.core.errors import UserError
from embodied.core.layout import ActionTerm, Layout, Term
from embodied.core.registry import TaskSpec, register_task
from embodied.sim_backends.base import choose_backend, make_backend
from embodied.sim_backends.splat.drive import CameraSpec
from embodied.sim_backends.splat.procedural import RoadSceneConfig, generate, load_scene, scene_indices
from embodied.sim_backends.splat.vehicle import VehicleParams, bicycle_step

LOOKAHEAD = (5.0, 10.0, 20.0, 30.0)  # [m] centreline points in the state observation
NEAREST_OBSTACLES = 2
STATE_DIM = 6 + 2 * len(LOOKAHEAD) + 3 * NEAREST_OBSTACLES
# anchor manoeuvres for probing: (steer, accel) as fractions of their limits, held for the probe horizon
ANCHOR_LEVELS = 9  # actions=anchors: MultiDiscrete([9, 9]) over (steer, accel) levels, GSDrive's action space
ANCHORS = ((0.0, 0.0), (-0.3, 0.0), (0.3, 0.0), (-0.8, 0.0), (0.8, 0.0), (0.0, -0.5))


@dataclass
class DriveConfig:
    episode_steps: int = 250  # 25 s at 10 Hz
    observation: str = "camera"  # camera | state
    cameras: int = 1  # 1: front; 2: front, front-left; 3: front, front-left, front-right
    image_height: int = 64
    image_width: int = 112
    frame_stack: int = 1  # the last k frames of every camera, oldest first, as channels of the image term
    far: float = 40.0  # [m] distance culling of the renderer
    render_kernel: str = "auto"  # auto | numba | torch
    scenes: int = 8  # procedural scenes of the split (envs are spread over them)
    split: str = "train"  # train | test (held-out scenes; what evaluation uses)
    scene_dir: str = ""  # a scene directory (scene.ply + route.json) instead of procedural scenes
    blocking_cars: tuple[int, int] = (0, 0)  # procedural: cars standing on the centreline, per scene
    moving_cars: int = 0  # per env: slower cars driving the route ahead, partly in the way
    moving_ahead: tuple[float, float] = (15.0, 60.0)  # [m] where they start, ahead of the car
    moving_speed: tuple[float, float] = (1.5, 4.5)  # [m/s]
    moving_lateral: tuple[float, float] = (0.4, 1.2)  # [m] +- offset from the centreline
    start_arc: tuple[float, float] = (2.0, 12.0)  # [m] where episodes start along the route
    start_lateral: float = 0.5  # [m] +- offset from the centreline at the start
    start_heading: float = 0.1  # [rad] +- heading error at the start
    start_speed: tuple[float, float] = (3.0, 7.0)  # [m/s]
    offroad_margin: float = 0.0  # [m] beyond the road half-width (rear axle) that ends the episode
    goal_margin: float = 3.0  # [m] before the end of the route that counts as arrived
    bonus_speed: float = 3.0  # [m/s] survival, proximity and alignment are paid in full at this speed, less below it
    reward: dict = field(default_factory=lambda: {
        "survival": 0.2, "proximity": 0.2, "progress": 1.0, "alignment": 0.2, "approach": 2.0, "comfort": 0.05,
        "collision": 5.0, "offroad": 6.0, "arrival": 1.0})
    actions: str = "continuous"  # continuous (steer, accel) | anchors: GSDrive's MultiDiscrete([9, 9])
    probing: bool = False
    probe_steps: int = 3
    probe_weight: float = 0.5
    probe_mode: str = "potential"  # potential (shaping, keeps the optimal policy) | additive (GSDrive as published)
    probe_gamma: float = 0.99  # the learner's discount, for potential shaping
    backend: str | None = None


@lru_cache(maxsize=64)
def _procedural(index: int, blocking: tuple[int, int]):
    return generate(index, RoadSceneConfig(blocking_cars=blocking))


def _scenes(cfg: DriveConfig) -> list:
    if cfg.scene_dir:
        return [load_scene(cfg.scene_dir)]
    if cfg.scenes < 1:
        raise UserError(f"scenes must be >= 1, got {cfg.scenes}")
    return [_procedural(i, tuple(cfg.blocking_cars)) for i in scene_indices(cfg.split, cfg.scenes)]


def _camera_specs(cfg: DriveConfig) -> tuple[CameraSpec, ...]:
    if cfg.cameras not in (1, 2, 3):
        raise UserError(f"cameras must be 1, 2 or 3, got {cfg.cameras}")
    if not (36 <= cfg.image_height <= 128 and 36 <= cfg.image_width <= 256):
        raise UserError(f"image size {cfg.image_height}x{cfg.image_width} outside 36-128 x 36-256 (the CNN needs "
                        ">= 36 px)")
    base = CameraSpec(width=cfg.image_width, height=cfg.image_height)
    sides = [] if cfg.cameras == 1 else [dataclasses.replace(base, name="front_left", yaw=55.0, left=0.5),
                                          dataclasses.replace(base, name="front_right", yaw=-55.0, left=-0.5)]
    return (base, *sides[:cfg.cameras - 1])


class DriveEnv(ManagedVecEnv):
    """Action ``[steer, accel]`` in [-1, 1]: the steering command ``steer * max_steer`` and the acceleration
    command ``accel * max_accel`` (``accel * max_brake`` when negative), both rate-limited by the car. With
    ``actions=anchors`` the action is a pair of indices ``MultiDiscrete([9, 9])`` picking one of the 9 x 9 anchor
    manoeuvres, levels ``-1 + i / 4`` of the same two commands (GSDrive's anchor grid, for the bicycle model)."""

    control_dt = VehicleParams.dt

    def __init__(self, cfg: DriveConfig, num_envs: int, device="cpu", seed: int = 0, task: str = "drive-lane-keep"):
        _check_config(cfg)
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.episode_steps)
        self.cfg = cfg
        self.weights = {**DriveConfig().reward, **cfg.reward}
        self.cameras = _camera_specs(cfg)
        self.sim = make_backend(choose_backend(task, cfg.backend), "car", self.num_envs, self.device,
                                scenes=_scenes(cfg), cameras=self.cameras, far=cfg.far, kernel=cfg.render_kernel,
                                moving_cars=cfg.moving_cars)
        self.params = self.sim.params
        n = self.num_envs
        z = lambda dtype=torch.float32: torch.zeros(n, dtype=dtype, device=self.device)  # noqa: E731
        self.start_arc, self.arc, self.lateral, self.heading = z(), z(), z(), z()
        self.index = z(torch.long)
        self.prev_accel = z()
        self._phi = z()  # probing potential of the current state (probe_mode=potential)
        if not 1 <= cfg.frame_stack <= 8:
            raise UserError(f"frame_stack must be 1-8, got {cfg.frame_stack}")
        self._frame = (3 * len(self.cameras), cfg.image_height, cfg.image_width)  # one render of every camera
        self.image_shape = (cfg.frame_stack * self._frame[0], *self._frame[1:])
        self._image = torch.zeros(n, *self.image_shape, device=self.device)
        self._stale = torch.ones(n, dtype=torch.bool, device=self.device)  # images to render before observing
        self._first = torch.ones(n, dtype=torch.bool, device=self.device)  # episode starts: fill the whole stack
        pol_dim = STATE_DIM if cfg.observation == "state" else int(np.prod(self.image_shape)) + 2
        self.single_observation_space = gym.spaces.Dict({
            "policy": box(-np.inf, np.inf, (pol_dim,)), "critic": box(-np.inf, np.inf, (STATE_DIM + 2,))})
        self.single_action_space = box(-1.0, 1.0, (2,)) if cfg.actions == "continuous" else \
            gym.spaces.MultiDiscrete([ANCHOR_LEVELS, ANCHOR_LEVELS])

    # ---- episode start --------------------------------------------------------------------------------------
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        k, c, g, dev = env_ids.numel(), self.cfg, self.generator, self.device
        u = lambda: torch.rand(k, generator=g, device=dev)  # noqa: E731
        routes, scene = self.sim.routes, self.sim.scene[env_ids]
        arc = c.start_arc[0] + (c.start_arc[1] - c.start_arc[0]) * u()
        j = (arc / 0.5).long().clamp(max=routes.points.shape[1] - 2)
        centre, heading = routes.points[scene, j], routes.heading[scene, j]
        lat = (2 * u() - 1) * c.start_lateral
        x = torch.zeros(k, self.sim.STATE.dim, device=dev)
        x[:, 0] = centre[:, 0] - torch.sin(heading) * lat
        x[:, 1] = centre[:, 1] + torch.cos(heading) * lat
        x[:, 2] = heading + (2 * u() - 1) * c.start_heading
        x[:, 3] = c.start_speed[0] + (c.start_speed[1] - c.start_speed[0]) * u()
        self.sim.set_state_idx(env_ids, x)
        self.sim.hint[env_ids] = j
        idx, arc_t, lat_t, head_t = routes.track(x[:, :2], scene, j)
        self.sim.hint[env_ids] = idx
        self.index[env_ids], self.arc[env_ids], self.lateral[env_ids] = idx, arc_t, lat_t
        self.heading[env_ids], self.start_arc[env_ids] = head_t, arc_t
        self.prev_accel[env_ids] = 0.0
        m = c.moving_cars
        if m:
            v = lambda lo_hi: lo_hi[0] + (lo_hi[1] - lo_hi[0]) * torch.rand(k, m, generator=g, device=dev)  # noqa
            side = torch.where(torch.rand(k, m, generator=g, device=dev) < 0.5, -1.0, 1.0)
            self.sim.movers[env_ids] = torch.stack([arc_t[:, None] + v(c.moving_ahead), side * v(c.moving_lateral),
                                                    v(c.moving_speed)], -1)
        self._stale[env_ids] = True
        self._first[env_ids] = True
        if c.probing:  # the potential of the episode's first state
            self._phi[env_ids] = self.probe(env_ids).amax(1)

    # ---- step -----------------------------------------------------------------------------------------------
    def _controls(self, action: torch.Tensor) -> torch.Tensor:
        if self.cfg.actions == "anchors":  # index i of 9 -> level -1 + 2 i / 8 (steer, then acceleration)
            action = -1.0 + 2.0 * action.round().clamp(0, ANCHOR_LEVELS - 1) / (ANCHOR_LEVELS - 1)
        a = action.clamp(-1, 1)
        p = self.params
        accel = torch.where(a[:, 1] >= 0, a[:, 1] * p.max_accel, a[:, 1] * p.max_brake)
        return torch.stack([a[:, 0] * p.max_steer, accel], -1)

    def _apply_action(self, action: torch.Tensor) -> None:
        self.prev_accel = self.sim.x[:, 5].clone()
        self._prev_lateral = self.lateral.abs()
        self._prev_arc = self.arc
        self.sim.step(self._controls(action))
        self.index, self.arc, self.lateral, self.heading = self.sim.track()
        self._stale[:] = True

    def _compute(self, action: torch.Tensor) -> StepTerms:
        w, x, p = self.weights, self.sim.x, self.params
        lat = self.lateral.abs()
        herr = _wrap(x[:, 2] - self.heading).abs()
        clearance = self.sim.routes.obstacle_clearance(x, self.sim.scene, p, self.sim.mover_boxes())
        collision = clearance <= 0
        offroad = lat > self.sim.routes.half_width[self.sim.scene] + self.cfg.offroad_margin
        arrived = self.arc >= self.sim.routes.length[self.sim.scene] - self.cfg.goal_margin
        dist_change = self._prev_lateral - lat
        approach = torch.where(dist_change > 0, 1.5 * dist_change, dist_change).clamp_min(-0.2 / max(w["approach"],
                                                                                                      1e-9))
        jerk = (x[:, 5] - self.prev_accel) / self.control_dt
        # the per-step bonuses are paid in proportion to speed up to bonus_speed: a car standing still on the road
        # earns nothing (it earned 0.6 per step, and one pixel seed stopped for good at 32k steps and kept it)
        moving = (x[:, 3] / self.cfg.bonus_speed).clamp(0.0, 1.0)
        terms = {
            "survival": w["survival"] * moving,
            "proximity": w["proximity"] * moving * _steps(lat, (0.5, 1.0, 2.0), (1.0, 0.6, 0.2)),
            "progress": w["progress"] * (self.arc - self._prev_arc),
            "alignment": w["alignment"] * moving * _steps(herr, (math.radians(5), math.radians(15)), (1.0, 0.5)),
            "approach": w["approach"] * approach,
            "comfort": -w["comfort"] * ((x[:, 5].abs() - 2).clamp_min(0) + (jerk.abs() - 5).clamp_min(0)),
            "collision": -w["collision"] * collision.float(),
            "offroad": -w["offroad"] * (offroad & ~collision).float(),
            # arriving early forgoes the per-step bonuses of the steps left: paid here, so that crawling along the
            # road for the whole time limit is never worth more than driving the route (it was worth about as much:
            # 250 steps x 0.6 vs 100 m x 1.0 + 80 steps x 0.6, and one seed's policy crawled for 100k steps)
            "arrival": w["arrival"] * (arrived & ~collision & ~offroad).float()
            * (self.max_episode_steps - self.episode_length).clamp_min(0).float()
            * (w["survival"] + w["proximity"] + w["alignment"]),
        }
        if self.cfg.probing:
            phi = self.probe().amax(1)
            if self.cfg.probe_mode == "additive":
                terms["probe"] = self.cfg.probe_weight * phi
            else:
                ended = collision | offroad | arrived
                terms["probe"] = self.cfg.probe_weight * (self.cfg.probe_gamma * phi * (~ended).float() - self._phi)
            self._phi = phi
        travelled = (self.arc - self.start_arc).clamp_min(0)
        total = (self.sim.routes.length[self.sim.scene] - self.cfg.goal_margin - self.start_arc).clamp_min(1.0)
        self._completion = (travelled / total).clamp(0, 1)
        self._collision, self._offroad, self._arrived = collision, offroad & ~collision, arrived & ~collision & ~offroad
        metrics = {"speed": x[:, 3], "lateral_error": lat, "clearance": clearance.clamp(max=50.0)}
        return StepTerms(terms, collision | offroad | arrived, metrics)

    def _final_info(self, done: torch.Tensor) -> dict:
        info = super()._final_info(done)
        info.update({"route_completion": self._completion.clone(), "collision": self._collision.float(),
                     "offroad": self._offroad.float(), "success": self._arrived.float()})
        return info

    # ---- trajectory probing (geometry only) -----------------------------------------------------------------
    @torch.no_grad()
    def probe(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """GSDrive's future reward of each anchor manoeuvre ``[N, K]`` from the current state (of ``env_ids``, all
        if None); the sim's state is not changed (the rollout runs on copies through the pure ``bicycle_step``)."""
        ids = self._all_ids if env_ids is None else env_ids
        n, k, p, routes = ids.numel(), len(ANCHORS), self.params, self.sim.routes
        anchors = torch.tensor(ANCHORS, device=self.device)
        ctrl = torch.stack([anchors[:, 0] * p.max_steer, anchors[:, 1] * p.max_brake], -1)  # [K, 2]
        x = self.sim.x[ids][:, None, :].expand(n, k, -1).reshape(n * k, -1)
        scene = self.sim.scene[ids].repeat_interleave(k)
        hint, arc0 = self.index[ids].repeat_interleave(k), self.arc[ids].repeat_interleave(k)
        movers = self.sim.movers[ids].repeat_interleave(k, 0)
        ctrl = ctrl.repeat(n, 1)
        half = routes.half_width[scene]
        total = torch.zeros(n * k, device=self.device)
        crashed = torch.zeros(n * k, dtype=torch.bool, device=self.device)
        arc_prev, r = arc0, None
        for t in range(self.cfg.probe_steps):
            x = bicycle_step(x, ctrl, p)
            hint, arc, lat, _ = routes.track(x[:, :2], scene, hint)
            movers = self.sim.advance_movers(movers, scene)
            hit = routes.obstacle_clearance(x, scene, p, self.sim.mover_boxes(movers, scene)) <= 0
            off = lat.abs() > half
            r = (0.3 + 0.2 * (arc - arc_prev) + 0.15 * _steps(lat.abs(), (0.3, 0.5, 1.0, 2.0, 3.0),
                                                                (1.0, 0.8, 0.5, 0.2, 0.05))
                 - 1.0 * hit.float() - 0.5 * (off & ~hit).float())
            r = torch.where(crashed, torch.zeros_like(r), r)
            total = total + (0.9 ** t) * r
            crashed |= hit | off
            arc_prev = arc
        future = 0.7 * r + 0.3 * total - 4.0 * crashed.float()
        return future.clamp(-5.0, 5.0).reshape(n, k)

    # ---- observations ---------------------------------------------------------------------------------------
    def _state_features(self) -> torch.Tensor:
        x, p, routes, scene = self.sim.x, self.params, self.sim.routes, self.sim.scene
        yaw = x[:, 2]
        c, s = torch.cos(yaw), torch.sin(yaw)
        herr = _wrap(yaw - self.heading)

        def ego(pts):  # [N, K, 2] world -> car frame
            d = pts - x[:, None, :2]
            return torch.stack([c[:, None] * d[..., 0] + s[:, None] * d[..., 1],
                                -s[:, None] * d[..., 0] + c[:, None] * d[..., 1]], -1)

        ahead = ego(routes.ahead(scene, self.index, torch.tensor(LOOKAHEAD, device=self.device))) / 20.0
        boxes, mask = routes.boxes[scene], routes.box_mask[scene]
        movers = self.sim.mover_boxes()
        if movers.shape[1]:
            boxes = torch.cat([boxes, movers], 1)
            mask = torch.cat([mask, torch.ones(movers.shape[:2], dtype=torch.bool, device=mask.device)], 1)
        rel = ego(boxes[..., :2])
        dist = rel.norm(dim=-1)
        dist = torch.where(mask & (rel[..., 0] > -5.0), dist, torch.full_like(dist, 1e3))
        order = dist.argsort(1)[:, :NEAREST_OBSTACLES]
        if order.shape[1] < NEAREST_OBSTACLES:
            order = torch.cat([order, order[:, :1].expand(-1, NEAREST_OBSTACLES - order.shape[1])], 1)
        near_rel, near_d = rel.gather(1, order[..., None].expand(-1, -1, 2)), dist.gather(1, order)
        seen = (near_d < 40.0).float()[..., None]
        obstacles = torch.cat([near_rel / 20.0 * seen, seen], -1).reshape(x.shape[0], -1)
        base = torch.stack([self.lateral / routes.half_width[scene], torch.sin(herr), torch.cos(herr), x[:, 3] / 10.0,
                            x[:, 4] / p.max_steer, x[:, 5] / p.max_accel], -1)
        return torch.cat([base, ahead.reshape(x.shape[0], -1), obstacles], -1)

    def _observe(self) -> Obs:
        state = self._state_features()
        total = (self.sim.routes.length[self.sim.scene] - self.start_arc).clamp_min(1.0)
        critic = torch.cat([state, ((self.arc - self.start_arc) / total)[:, None],
                            (self.episode_length.float() / self.max_episode_steps)[:, None]], -1)
        if self.cfg.observation == "state":
            return {"policy": state, "critic": critic}
        if self._stale.any():
            ids = self._stale.nonzero().squeeze(1)
            img = self.sim.render(ids).reshape(ids.numel(), *self._frame)  # [K, cams * 3, H, W]
            k = self.cfg.frame_stack
            if k == 1:
                self._image[ids] = img
            else:  # shift the stack by one frame; an episode's first frame fills every slot
                c = self._frame[0]
                old = self._image[ids]
                stacked = torch.cat([old[:, c:], img], 1)
                self._image[ids] = torch.where(self._first[ids, None, None, None], img.repeat(1, k, 1, 1), stacked)
            self._stale[ids] = False
            self._first[ids] = False
        x = self.sim.x
        proprio = torch.stack([x[:, 3] / 10.0, x[:, 4] / self.params.max_steer], -1)
        return {"policy": torch.cat([self._image.reshape(self.num_envs, -1), proprio], -1), "critic": critic}

    def _state_finite(self) -> torch.Tensor:
        return self.sim.finite()

    def layout(self) -> Layout:
        p = self.params
        state_terms = (Term("route_state", STATE_DIM, "1", "car",
                            "lateral offset / road half-width, sin and cos of the heading error, speed / 10 m/s, "
                            "steer / max, accel / max, centreline points 5-30 m ahead / 20 m (car frame), nearest "
                            f"{NEAREST_OBSTACLES} obstacles (x, y / 20 m, seen)"),)
        if self.cfg.observation == "state":
            policy = state_terms
        else:
            policy = (Term("cameras", int(np.prod(self.image_shape)), "1", "camera",
                           "RGB in [0, 1], cameras " + ", ".join(c.name for c in self.cameras),
                           shape=self.image_shape),
                      Term("speed", 1, "10 m/s", "car"), Term("steer", 1, "1", "car", "steering angle / max"))
        critic = (*state_terms, Term("progress", 1, "1"), Term("time", 1, "1"))
        if self.cfg.actions == "anchors":
            top, step = ANCHOR_LEVELS - 1, 2.0 / (ANCHOR_LEVELS - 1)
            action = (ActionTerm("steer", 1, "rad", 0, top, step * p.max_steer, -p.max_steer,
                                 "anchor index: steering angle command"),
                      ActionTerm("accel", 1, "m/s^2", 0, top, step * p.max_accel, -p.max_accel,
                                 f"anchor index: acceleration command (below level 4 it scales by {p.max_brake})"))
        else:
            action = (ActionTerm("steer", 1, "rad", scale=p.max_steer, description="steering angle command"),
                      ActionTerm("accel", 1, "m/s^2", scale=p.max_accel,
                                 description=f"acceleration command; negative values scale by {p.max_brake} "
                                             "(brake)"))
        return Layout({"policy": policy, "critic": critic}, action, 1.0 / self.control_dt)

    # ---- rendering, checkpoints -----------------------------------------------------------------------------
    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        from embodied.tasks.driving.video import drive_frame

        return drive_frame(self, env_idx)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sim": self.sim.get_state(),
                "track": torch.stack([self.start_arc, self.arc, self.lateral, self.heading, self.prev_accel,
                                      self._phi]),
                "index": self.index.clone(),
                "frames": self._image.clone() if self.cfg.frame_stack > 1 else None}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.sim.set_state(state["sim"])
        self.start_arc, self.arc, self.lateral, self.heading, self.prev_accel, self._phi = (
            t.clone().to(self.device) for t in state["track"])
        self.index = state["index"].clone().to(self.device)
        self._stale[:] = True
        if self.cfg.frame_stack > 1:  # the stack holds past frames (taken after the last observation): restore it
            self._image = state["frames"].clone().to(self.device)
            self._stale[:] = False
            self._first[:] = False


def _check_config(cfg: DriveConfig) -> None:
    """Every value a user sets, checked before scenes are built: one line each."""
    choices = {"observation": ("camera", "state"), "split": ("train", "test"), "actions": ("continuous", "anchors"),
               "render_kernel": ("auto", "numba", "torch"), "probe_mode": ("potential", "additive")}
    for key, ok in choices.items():
        if getattr(cfg, key) not in ok:
            raise UserError(f"{key} must be one of {', '.join(ok)}, got {getattr(cfg, key)!r}")
    unknown = set(cfg.reward) - set(DriveConfig().reward)
    if unknown:
        raise UserError(f"unknown reward terms {sorted(unknown)}; known: {sorted(DriveConfig().reward)}")
    for key in ("start_arc", "start_speed", "moving_ahead", "moving_speed", "moving_lateral", "blocking_cars"):
        v = getattr(cfg, key)
        if len(v) != 2 or not 0 <= v[0] <= v[1]:
            raise UserError(f"{key} must be a range [low, high] with 0 <= low <= high, got {list(v)}")
    for key, lo, hi in (("episode_steps", 1, 10**6), ("probe_steps", 1, 50), ("moving_cars", 0, 8),
                        ("scenes", 1, 1000)):
        if not lo <= getattr(cfg, key) <= hi:
            raise UserError(f"{key} must be in {lo}-{hi}, got {getattr(cfg, key)}")
    if cfg.far <= 0 or cfg.bonus_speed <= 0 or cfg.start_lateral < 0 or cfg.start_heading < 0:
        raise UserError("far and bonus_speed must be > 0 and start_lateral, start_heading >= 0")


def _wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def _steps(value: torch.Tensor, thresholds: tuple[float, ...], levels: tuple[float, ...]) -> torch.Tensor:
    """``levels[i]`` for the first threshold ``value`` is below, 0 beyond the last."""
    out = torch.zeros_like(value)
    for th, lv in zip(reversed(thresholds), reversed(levels)):
        out = torch.where(value < th, torch.full_like(value, lv), out)
    return out


def _eval(cfg: DriveConfig) -> DriveConfig:
    """Evaluation drives the held-out scenes."""
    return dataclasses.replace(cfg, split="test") if not cfg.scene_dir else cfg


@dataclass
class DriveAvoidConfig(DriveConfig):
    blocking_cars: tuple[int, int] = (2, 4)
    moving_cars: int = 2


SWEEP = {"episode_steps": 40, "scenes": 2}
register_task(TaskSpec(
    name="drive-lane-keep", make=DriveEnv, config_cls=DriveConfig, backends=("splat",),
    description="Keep a car on the route of a Gaussian-splat street from a 64x112 front camera (kinematic bicycle)",
    success_metric="success", default_algo="ppo", eval_config=_eval, sweep_overrides=SWEEP))
register_task(TaskSpec(
    name="drive-avoid", make=lambda cfg, num_envs, device="cpu", seed=0: DriveEnv(cfg, num_envs, device, seed,
                                                                                  task="drive-avoid"),
    config_cls=DriveAvoidConfig, backends=("splat",),
    description="Drive the route of a Gaussian-splat street around cars standing on it, from a front camera",
    success_metric="success", default_algo="ppo", eval_config=_eval, sweep_overrides=SWEEP))
