"""Tabletop manipulation with a Franka Panda on ``mujoco_cpu``: ``reach``, ``push-to-goal``, ``pick-place`` and
``peg-insert`` (hole clearance 2 mm). LIBERO's action space at 20 Hz (``controller.py``), 2 ms physics steps.

Observations (``policy``): the grip point's position and rotation (the first two columns of its matrix), the
finger opening, then per task the object's position and rotation, the object relative to the grip point, the
goal, and the goal relative to the object (or to the grip point, in ``reach``). ``critic`` adds the privileged
state: the arm's joint positions and velocities, the object's velocity and its randomized friction and mass
factors. An episode ends when the task's success predicate holds (``final_info["success"]`` = 1), when the
object falls off the table (a failure, penalized like the success is paid), or at the time limit. Object poses,
friction and mass are drawn at every reset; push-to-goal and pick-place also have two distractor cubes standing
around the workspace (``distractors``, 0-4), which the observations leave out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import mujoco
import numpy as np
import torch

from embodied.core.base import ManagedVecEnv, Obs, StepTerms
from embodied.core.errors import UserError
from embodied.core.registry import TaskSpec, register_task
from embodied.sim_backends.base import make_backend
from embodied.tasks.manipulation.controller import DeltaPoseController
from embodied.tasks.manipulation.scene import FINGER_OPEN, HOME_QPOS, TIMESTEP, Box, Marker, SceneSpec, build_mjcf

F64 = torch.float64
CUBE = 0.02  # [m] half edge of the cube
PEG = (0.01, 0.01, 0.04)  # [m] half extents of the peg (2 x 2 x 8 cm)
HOLE_CLEARANCE = 0.002  # [m] hole width minus peg width
HOLE_DEPTH = 0.04  # [m] the fixture's height
CLUTTER = 0.015  # [m] half edge of a distractor cube
# where distractors stand (x, y centres [m], jittered at reset): the table's corners around the workspace
CLUTTER_SLOTS = ((0.85, -0.40), (0.85, 0.40), (0.25, -0.40), (0.25, 0.40))
CLUTTER_RGBA = ((0.95, 0.85, 0.1, 1.0), (0.6, 0.2, 0.8, 1.0), (0.1, 0.8, 0.8, 1.0), (0.95, 0.95, 0.95, 1.0))


@dataclass
class TabletopConfig:
    episode_steps: int = 100  # [control steps of 50 ms]
    control_hz: float = 20.0
    max_translation: float = 0.03  # [m] per control step at |action| = 1
    max_rotation: float = 0.3  # [rad] per control step at |action| = 1
    sim_threads: int = 1
    arm_noise: float = 0.02  # [rad] uniform +- on the home joint angles at reset
    object_xy: list[float] = field(default_factory=lambda: [0.08, 0.12])  # [m] +- x, y range of the object's start
    object_yaw: float = 0.5  # [rad] +- range of the object's start yaw
    goal_xy: list[float] = field(default_factory=lambda: [0.08, 0.12])  # [m] +- x, y range of the goal
    friction: list[float] = field(default_factory=lambda: [0.7, 1.3])  # factor range on the object's friction
    mass: list[float] = field(default_factory=lambda: [0.5, 1.5])  # factor range on the object's mass
    distractors: int = 0  # coloured cubes (0-4) standing around the workspace, not part of the task
    distractor_jitter: float = 0.03  # [m] +- x, y range around their slots
    success_bonus: float = 10.0  # reward on the step the task succeeds (the episode ends there)
    action_cost: float = 0.01  # per |action|^2


@dataclass
class ReachConfig(TabletopConfig):
    episode_steps: int = 50
    tolerance: float = 0.02  # [m] the grip point within this of the goal


@dataclass
class PushConfig(TabletopConfig):
    tolerance: float = 0.03  # [m] the cube's centre within this of the goal, in the table plane
    distractors: int = 2


@dataclass
class PickPlaceConfig(TabletopConfig):
    episode_steps: int = 120
    distractors: int = 2
    # the cube anywhere in a 30 x 20 cm region at any yaw (a quarter turn: the cube's symmetry), the plate anywhere
    # in a 30 x 12 cm region beside it (their regions leave the two apart), the arm's start +-0.1 rad a joint
    object_xy: list[float] = field(default_factory=lambda: [0.15, 0.10])
    object_yaw: float = 0.785
    goal_xy: list[float] = field(default_factory=lambda: [0.15, 0.06])
    arm_noise: float = 0.1
    # [m] the cube's rise over which the lift cost falls linearly from 0.5 to 0 (0: a step, paid in full until the
    # cube is 1 cm up). A step gives a residual no gradient where its BC base stalls with the cube grasped on the
    # table, pressing down (a seed-4 residual under the step: 4 of its 11 never-lifted episodes, the residual's
    # +0.1 against the base's -0.2 to -0.4 in z for 100 steps)
    lift_ramp: float = 0.01


@dataclass
class PegInsertConfig(TabletopConfig):
    episode_steps: int = 150
    object_yaw: float = 0.0  # the hole's sides are axis-aligned; the peg starts aligned with them
    insert_depth: float = 0.02  # [m] the peg's bottom at least this far below the fixture's top
    align_tolerance: float = 0.004  # [m] the peg's axis within this of the hole's, in the table plane
    # [deg] a peg tipped further than this from upright is lost (the episode fails there, with the drop's cost):
    # lying down it cannot be grasped from above again, and an episode that goes on only dilutes the learner's
    # signal (a BC base on 50 demos: 83 of its 97 failures in 100 episodes ended lying down); >= 90: only off the table
    tip_limit: float = 60.0


def _place_upright(qpos: torch.Tensor, adr: int, xy: torch.Tensor, z: float, yaw: torch.Tensor) -> None:
    """Write a free body's pose (at ``qpos[:, adr:adr + 7]``): at ``xy [K, 2]``, height ``z``, turned by ``yaw [K]``
    about the vertical."""
    qpos[:, adr:adr + 2], qpos[:, adr + 2] = xy, z
    qpos[:, adr + 3], qpos[:, adr + 4:adr + 6], qpos[:, adr + 6] = torch.cos(yaw / 2), 0.0, torch.sin(yaw / 2)


def rot6(mat: torch.Tensor) -> torch.Tensor:
    """``[N, 3, 3]`` -> the first two columns ``[N, 6]`` (a continuous rotation encoding)."""
    return mat[:, :, :2].transpose(1, 2).reshape(-1, 6)


class TabletopEnv(ManagedVecEnv):
    """What the four tasks share; a task states its scene, its object and goal sampling, and its reward."""

    task_name: str
    object_name: str | None = "cube"
    object_start = (0.55, 0.0)  # [m] centre of the object's start region
    goal_start = (0.55, 0.0)  # [m] centre of the goal region

    def __init__(self, cfg: TabletopConfig, num_envs: int, device="cpu", seed: int = 0):
        super().__init__(num_envs, device, seed, max_episode_steps=cfg.episode_steps)
        self.cfg = cfg
        if not 0 <= cfg.distractors <= len(CLUTTER_SLOTS):
            raise UserError(f"distractors must be in 0..{len(CLUTTER_SLOTS)}, got {cfg.distractors}")
        frame_skip = round(1.0 / (cfg.control_hz * TIMESTEP))
        spec = self.scene()
        spec.objects += [Box(f"clutter{i}", (CLUTTER,) * 3, (*CLUTTER_SLOTS[i], CLUTTER), rgba=CLUTTER_RGBA[i],
                             mass=0.03) for i in range(cfg.distractors)]
        self.sim = make_backend("mujoco_cpu", build_mjcf(spec), self.num_envs, self.device, frame_skip=frame_skip,
                                num_threads=cfg.sim_threads)
        m = self.sim.model
        self.control_dt = self.sim.dt
        self.sim.render_camera = "front"  # facing the robot across the table
        self.controller = DeltaPoseController(self.sim, cfg.max_translation, cfg.max_rotation)
        self.xpos, self.xmat = self.sim.t("xpos"), self.sim.t("xmat")
        self.home = torch.zeros(m.nq, dtype=F64)
        self.home[:7] = torch.tensor(HOME_QPOS, dtype=F64)
        self.home[7:9] = FINGER_OPEN
        self.home_ctrl = torch.zeros(m.nu, dtype=F64)
        self.home_ctrl[self.controller.arm_act] = self.home[:7]
        self.home_ctrl[self.controller.finger_act] = FINGER_OPEN
        self.goal = torch.zeros(self.num_envs, 3, dtype=F64)
        self.succeeded = torch.zeros(self.num_envs, dtype=torch.bool)
        if self.object_name is not None:
            body = m.body(self.object_name)
            self.obj_body, self.obj_qpos = body.id, int(m.jnt_qposadr[body.jntadr[0]])
            self.obj_dof = int(m.jnt_dofadr[body.jntadr[0]])
            geom = int(np.flatnonzero(m.geom_bodyid == body.id)[0])
            self.obj_geom = geom
            self.nominal_friction, self.nominal_mass = float(m.geom_friction[geom, 0]), float(m.body_mass[body.id])
            self.geom_friction, self.body_mass = self.sim.expand("geom_friction"), self.sim.expand("body_mass")
            self.factors = torch.ones(self.num_envs, 2, dtype=F64)  # friction, mass
        self.clutter_qpos = [int(m.jnt_qposadr[m.body(f"clutter{i}").jntadr[0]]) for i in range(cfg.distractors)]
        goal_id = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "goal")  # a task may draw no goal marker
        self._marker = int(m.body_mocapid[goal_id]) if goal_id >= 0 and m.body_mocapid[goal_id] >= 0 else None
        self.mocap_pos = self.sim.t("mocap_pos")
        self._setup()
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (7,), dtype=np.float32)
        self.sim.batch.forward()
        obs = self._observe()
        self.single_observation_space = gym.spaces.Dict(
            {k: gym.spaces.Box(-np.inf, np.inf, (v.shape[1],), dtype=np.float32) for k, v in obs.items()})

    # ---- per task -----------------------------------------------------------------------------
    def _setup(self) -> None:
        """What a task looks up in the built model before the first observation (its bodies' indices)."""

    def scene(self) -> SceneSpec:
        return SceneSpec([Box("cube", (CUBE,) * 3, (*self.object_start, CUBE)),
                          Marker("goal", (*self.goal_start, 0.1))])

    def _sample_goal(self, k: int) -> torch.Tensor:
        """Goals ``[k, 3]`` for ``k`` resetting envs."""
        raise NotImplementedError

    def _task_terms(self, grip: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Reward terms and the success predicate ``[N]`` bool."""
        raise NotImplementedError

    def _place_goal(self, env_ids: torch.Tensor) -> None:
        """Put what marks the goal (the marker; a task's goal fixture) where ``self.goal`` says, in ``env_ids``."""
        if self._marker is not None:
            self.mocap_pos[env_ids, self._marker] = self.goal[env_ids]

    # ---- helpers ------------------------------------------------------------------------------
    def _uniform(self, k: int, half) -> torch.Tensor:
        half = torch.as_tensor(half, dtype=F64)
        return (torch.rand(k, half.numel(), generator=self.generator, dtype=F64) * 2 - 1) * half

    def _apply_factors(self, env_ids: torch.Tensor) -> None:
        """The object's friction and mass in the worlds ``env_ids`` from its drawn ``factors``."""
        self.geom_friction[env_ids, self.obj_geom, 0] = self.nominal_friction * self.factors[env_ids, 0]
        self.body_mass[env_ids, self.obj_body] = self.nominal_mass * self.factors[env_ids, 1]
        self.sim.batch.set_const(env_ids.numpy())

    def object_pose(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.xpos[:, self.obj_body].clone(), self.xmat[:, self.obj_body].reshape(-1, 3, 3).clone()

    def finger_opening(self) -> torch.Tensor:
        return self.sim.qpos[:, 7:9].sum(1)  # [m] between the pads

    # ---- ManagedVecEnv hooks --------------------------------------------------------------------
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        k, m, cfg = env_ids.numel(), self.sim.model, self.cfg
        qpos = self.home.expand(k, -1).clone()
        qpos[:, :7] += self._uniform(k, [cfg.arm_noise] * 7)
        if self.object_name is not None:
            xy = torch.tensor(self.object_start, dtype=F64) + self._uniform(k, cfg.object_xy)
            _place_upright(qpos, self.obj_qpos, xy, float(m.body_pos[self.obj_body, 2]),  # resting on the table
                           self._uniform(k, [cfg.object_yaw])[:, 0])
            lo, hi = torch.tensor([cfg.friction[0], cfg.mass[0]], dtype=F64), \
                torch.tensor([cfg.friction[1], cfg.mass[1]], dtype=F64)
            self.factors[env_ids] = lo + torch.rand(k, 2, generator=self.generator, dtype=F64) * (hi - lo)
            self._apply_factors(env_ids)
        for i, a in enumerate(self.clutter_qpos):
            yaw = self._uniform(k, [np.pi / 4])[:, 0]
            xy = torch.tensor(CLUTTER_SLOTS[i], dtype=F64) + self._uniform(k, [cfg.distractor_jitter] * 2)
            _place_upright(qpos, a, xy, CLUTTER, yaw)
        self.goal[env_ids] = self._sample_goal(k)
        self._place_goal(env_ids)  # mocap poses: kept by the reset below, which forwards them too
        self.succeeded[env_ids] = False
        self.sim.set_state_idx(env_ids, torch.cat([qpos, torch.zeros(k, m.nv, dtype=F64)], 1))
        self.sim.ctrl[env_ids] = self.home_ctrl

    def _apply_action(self, action: torch.Tensor) -> None:
        # the poses after the step, not one substep before (the same call computes them: 2% of the step at N = 16)
        self.sim.step(self.controller.controls(action), positions=True)

    def _observe(self) -> Obs:
        grip, rot = self.controller.ee_pose()
        parts = [grip, rot6(rot), self.finger_opening()[:, None]]
        if self.object_name is not None:
            pos, orient = self.object_pose()
            parts += [pos, rot6(orient), pos - grip, self.goal, self.goal - pos]
        else:
            parts += [self.goal, self.goal - grip]
        policy = torch.cat(parts, 1)
        s, c = self.sim, self.controller
        privileged = [s.qpos[:, c.arm_qpos], s.qvel[:, c.arm_dof]]
        if self.object_name is not None:
            privileged += [s.qvel[:, self.obj_dof:self.obj_dof + 6], self.factors]
        return {"policy": policy.float(), "critic": torch.cat([policy, *privileged], 1).float()}

    def _compute(self, action: torch.Tensor) -> StepTerms:
        grip, _ = self.controller.ee_pose()
        terms, success = self._task_terms(grip)
        terms["action"] = -self.cfg.action_cost * (action.to(F64) ** 2).sum(1)
        terms["success"] = self.cfg.success_bonus * success.to(F64)
        self.succeeded = success.clone()  # reset clears it in place; the returned flags must stay
        metrics = {"success_rate": success.to(F64)}
        ended = success
        if self.object_name is not None:  # the object lost (off the table; a task may add more): the episode fails
            dropped = self._lost()
            terms["dropped"] = -self.cfg.success_bonus * dropped.to(F64)
            metrics["dropped"] = dropped.to(F64)
            ended = success | dropped
        return StepTerms(terms, ended, metrics)

    def _lost(self) -> torch.Tensor:
        """``[N]`` bool: the object can no longer be brought to the goal (here: off the table)."""
        return self.xpos[:, self.obj_body, 2] < -0.05

    def _final_info(self, done: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"success": self.succeeded.float()}

    def _state_finite(self) -> torch.Tensor:
        return self.sim.finite()

    def render_frame(self, env_idx: int = 0) -> np.ndarray:
        return self.sim.render_frame(env_idx)

    @property
    def can_render(self) -> bool:
        return self.sim.can_render

    # ---- restorable states: the worlds' rows, then the task's own per-env tensors ------------------------------
    def _state_keys(self) -> tuple[str, ...]:
        """The per-env tensors (attribute names, ``[N, ...]``) that with the physics make an env's whole state."""
        return ("goal", "succeeded") + (("factors",) if self.object_name is not None else ())

    def env_states(self) -> torch.Tensor:
        task = [getattr(self, k).reshape(self.num_envs, -1).to(F64) for k in self._state_keys()]
        return torch.cat([self.sim.state_rows(), *task], 1)

    def _restore_idx(self, env_ids: torch.Tensor, rows: torch.Tensor) -> None:
        rows = rows.to(F64)
        at = self.sim.state_row_size
        size = at + sum(getattr(self, k)[0].numel() for k in self._state_keys())
        if rows.shape[1] != size:
            raise UserError(f"{self.task_name}: a recorded state has {rows.shape[1]} entries; this task's have {size} "
                            "(recorded with other settings?)")
        for k in self._state_keys():
            value = getattr(self, k)
            size = value[0].numel()
            value[env_ids] = rows[:, at:at + size].reshape(-1, *value.shape[1:]).to(value.dtype)
            at += size
        self._place_goal(env_ids)
        if self.object_name is not None:
            self._apply_factors(env_ids)
        self.sim.set_state_rows(env_ids, rows[:, :self.sim.state_row_size])

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sim": self.sim.get_state(),
                **{k: getattr(self, k).clone() for k in self._state_keys()}}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        for k in self._state_keys():
            getattr(self, k).copy_(state[k])
        self._place_goal(self._all_ids)
        if self.object_name is not None:
            self._apply_factors(self._all_ids)
        self.sim.set_state(state["sim"])


class ReachEnv(TabletopEnv):
    """Bring the grip point to a goal in the air."""

    object_name = None

    def scene(self) -> SceneSpec:
        return SceneSpec([Marker("goal", (0.5, 0.0, 0.15))])

    def _sample_goal(self, k):
        centre = torch.tensor([0.5, 0.0, 0.17], dtype=F64)
        return centre + self._uniform(k, [0.12, 0.18, 0.12])

    def _task_terms(self, grip):
        dist = (self.goal - grip).norm(dim=1)
        return {"distance": -dist}, dist < self.cfg.tolerance


class PushEnv(TabletopEnv):
    """Push the cube to a goal on the table (no lifting needed)."""

    object_start, goal_start = (0.5, 0.0), (0.6, 0.0)

    def _sample_goal(self, k):
        xy = torch.tensor(self.goal_start, dtype=F64) + self._uniform(k, self.cfg.goal_xy)
        return torch.cat([xy, torch.full((k, 1), CUBE, dtype=F64)], 1)

    def _task_terms(self, grip):
        pos, _ = self.object_pose()
        reach = (pos - grip).norm(dim=1)
        dist = (self.goal[:, :2] - pos[:, :2]).norm(dim=1)
        return {"reach": -0.5 * reach, "push": -dist}, dist < self.cfg.tolerance


class PickPlaceEnv(TabletopEnv):
    """Pick the cube up and place it on the plate (a raised square, 10 x 10 cm, 1 cm high, placed per env): success
    is LIBERO's On(cube, plate): the cube's centre over the plate and the cube resting on it (at its resting height
    within 2 mm, slower than 5 cm/s)."""

    object_start, goal_start = (0.5, -0.12), (0.5, 0.12)
    PLATE = (0.05, 0.05, 0.005)

    def scene(self) -> SceneSpec:
        return SceneSpec([Box("cube", (CUBE,) * 3, (*self.object_start, CUBE)),
                          Box("plate", self.PLATE, (*self.goal_start, self.PLATE[2]), rgba=(0.2, 0.4, 0.9, 1), mass=0,
                              movable=True),
                          Marker("goal", (*self.goal_start, 2 * self.PLATE[2] + CUBE), size=0.01)])

    def _sample_goal(self, k):
        # the plate drawn in goal_xy around goal_start; the goal is the cube resting on it
        xy = torch.tensor(self.goal_start, dtype=F64) + self._uniform(k, self.cfg.goal_xy)
        return torch.cat([xy, torch.full((k, 1), 2 * self.PLATE[2] + CUBE, dtype=F64)], 1)

    def _place_goal(self, env_ids: torch.Tensor) -> None:
        super()._place_goal(env_ids)
        plate = int(self.sim.model.body("plate").mocapid[0])
        self.mocap_pos[env_ids, plate, :2] = self.goal[env_ids, :2]
        self.mocap_pos[env_ids, plate, 2] = self.PLATE[2]

    def _task_terms(self, grip):
        pos, _ = self.object_pose()
        reach = (pos - grip).norm(dim=1)
        place = (self.goal - pos).norm(dim=1)
        over = ((pos[:, :2] - self.goal[:, :2]).abs() < self.PLATE[0]).all(1)
        # on the plate and still: at its resting height (not carried through it) and not moving
        speed = self.sim.qvel[:, self.obj_dof:self.obj_dof + 3].norm(dim=1)
        resting = ((pos[:, 2] - self.goal[:, 2]).abs() < 0.002) & (speed < 0.05)
        rise = pos[:, 2] - CUBE
        ramp = self.cfg.lift_ramp
        lifted = (rise / ramp).clamp(0.0, 1.0) if ramp > 0 else (rise > 0.01).to(F64)
        # every term is a cost (<= 0): a paid lift outearned the success bonus, and RL learned to hold the cube up
        return {"reach": -0.5 * reach, "lift": -0.5 * (1.0 - lifted), "place": -place}, over & resting


class PegInsertEnv(TabletopEnv):
    """Pick the peg (2 x 2 x 8 cm) up and insert it into the square hole of a fixture (2.2 x 2.2 cm, 4 cm deep:
    2 mm clearance)."""

    object_name = "peg"
    object_start, goal_start = (0.5, -0.12), (0.5, 0.12)

    def __init__(self, cfg: PegInsertConfig, num_envs: int, device="cpu", seed: int = 0):
        if not cfg.tip_limit > 0:  # 0 or less: every peg, upright or not, would be lost at the first step
            raise UserError(f"tip_limit is an angle in degrees > 0 (>= 90: no tip rule), got {cfg.tip_limit}")
        super().__init__(cfg, num_envs, device, seed)

    def scene(self) -> SceneSpec:
        hx, hy = self.goal_start
        half_hole = PEG[0] + HOLE_CLEARANCE / 2
        wall = 0.02  # [m] wall thickness
        h = HOLE_DEPTH / 2
        walls = [Box("wall_px", (wall / 2, half_hole + wall, h), (hx + half_hole + wall / 2, hy, h), mass=0),
                 Box("wall_nx", (wall / 2, half_hole + wall, h), (hx - half_hole - wall / 2, hy, h), mass=0),
                 Box("wall_py", (half_hole, wall / 2, h), (hx, hy + half_hole + wall / 2, h), mass=0),
                 Box("wall_ny", (half_hole, wall / 2, h), (hx, hy - half_hole - wall / 2, h), mass=0)]
        for w in walls:
            w.rgba = (0.3, 0.3, 0.35, 1)
        # the Franka Hand's grasp force for a thin part: the kitchen model's finger servos (500 N/m) squeeze the 2 cm
        # peg with 5 N a finger, and it slid out of the fingers under an expert's 3 mm-a-step jitter (the expert at
        # action noise 0.1 placed 36% of 64 episodes; with 20 N a finger 88%, as many as at noise 0.01)
        return SceneSpec([Box("peg", PEG, (*self.object_start, PEG[2]), rgba=(0.9, 0.6, 0.1, 1), mass=0.05), *walls,
                          Marker("goal", (hx, hy, HOLE_DEPTH + PEG[2]), size=0.005)], finger_kp=2000.0)

    def _sample_goal(self, k):
        # the peg's centre when inserted by insert_depth
        return torch.tensor([*self.goal_start, HOLE_DEPTH - self.cfg.insert_depth + PEG[2]],
                            dtype=F64).expand(k, 3).clone()

    def _task_terms(self, grip):
        pos, _ = self.object_pose()
        reach = (pos - grip).norm(dim=1)
        align = (self.goal[:, :2] - pos[:, :2]).norm(dim=1)
        depth = (pos[:, 2] - self.goal[:, 2]).clamp_min(0.0) * (align < 0.02)  # counted once over the hole
        inserted = (align < self.cfg.align_tolerance) & (pos[:, 2] <= self.goal[:, 2] + 1e-4)
        return {"reach": -0.5 * reach, "align": -align, "insert": -depth}, inserted

    def _lost(self) -> torch.Tensor:
        if self.cfg.tip_limit >= 90:
            return super()._lost()
        axis_z = self.xmat[:, self.obj_body].reshape(-1, 3, 3)[:, 2, 2]  # the peg's long axis, vertical component
        return super()._lost() | (axis_z < math.cos(math.radians(self.cfg.tip_limit)))


TASKS = {"reach": (ReachEnv, ReachConfig), "push-to-goal": (PushEnv, PushConfig),
         "pick-place": (PickPlaceEnv, PickPlaceConfig), "peg-insert": (PegInsertEnv, PegInsertConfig)}

def _expert(env, **kwargs):
    from embodied.tasks.manipulation.experts import expert

    return expert(env, **kwargs)


for _name, (_cls, _cfg) in TASKS.items():
    _cls.task_name = _name
    register_task(TaskSpec(name=_name, make=_cls, config_cls=_cfg, description=f"Franka Panda tabletop: {_name}",
                           backends=("mujoco_cpu",), success_metric="success", default_algo="ppo",
                           tags=("mujoco", "manipulation"), expert=_expert))

