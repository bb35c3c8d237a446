"""Scripted experts for the tabletop tasks, batched: every env runs its own phase machine (approach, descend, grasp,
lift, move, place or insert, release) on the true state, in LIBERO's action space. ``expert(env)`` gives the
task's; calling it with an observation returns actions for all envs (it reads the env's state; the observation
only fixes the batch). Noise knobs: ``action_noise`` (Gaussian std in normalized action units, added to every
action), ``target_noise`` (std [m] of a per-episode offset of every waypoint in the table plane) and ``miss`` (the
fraction of episodes whose first grasp is aimed ``MISS_OFFSET`` off the object, to show the recovery), ``detour``
(the fraction whose carry goes first over a point ``DETOUR_OFFSET`` from the goal in a random direction, then to the
goal: the correction toward it from every side, where a fixed layout's demonstrations all approach from one). The
action a demonstration records is ``expert.label``, the executed one without the noise and the aim-off (DART, Laskey
et al. 2017: the states the perturbations lead to, labelled with the expert's correction)."""

from __future__ import annotations

import math

import torch

from embodied.core.errors import UserError
from embodied.tasks.manipulation.controller import axis_angle_matrix, rotation_error
from embodied.tasks.manipulation.tabletop import CUBE, PEG, PegInsertEnv, PickPlaceEnv, PushEnv, ReachEnv

F64 = torch.float64
ABOVE = 0.08  # [m] approach height over the object's centre
CARRY = 0.14  # [m] height of the grip point while carrying
CLOSE_STEPS = 6  # control steps the fingers get to close (0.3 s)
HOLD_BAND = 0.013  # [m] ``lift="held"``: the fingers hold the object while their opening is this little over min_hold
LIFTS = ("timer", "held")
MISS_OFFSET = 0.035  # [m] how far from the object a missed grasp (``miss``) is aimed, in the table plane
DETOUR_OFFSET = 0.03  # [m] how far from the goal a detour (``detour``) carries the object first, in the table plane


def _yaw(rot: torch.Tensor) -> torch.Tensor:
    return torch.atan2(rot[:, 1, 0], rot[:, 0, 0])


def _fold(angle: torch.Tensor, period: float) -> torch.Tensor:
    """``angle`` folded into ``[-period / 2, period / 2)``: the shortest turn to a target symmetric under ``period``."""
    return torch.remainder(angle + period / 2, period) - period / 2


class Expert:
    default_noise = 0.1  # action_noise where none is given

    # miss where none is given: demonstrations of the recovery did not lift pick-place BC (3 seeds at 50 demos, a
    # wider randomization: 58% without, 55% with miss=0.3), so none by default
    default_miss = 0.0
    default_detour = 0.0  # detour where none is given
    # lift where none is given: mini-libero's filtered-bc from 10 demos a task on held demonstrations, seeds 0 / 1 / 4,
    # 86.2 / 77.7 / 86.2% against 89.2 / 87.7 / 82.3% on the timer's (130 starts each; stops 66-67)
    default_lift = "timer"
    grasps = False  # whether the expert closes a grasp (lift is its setting)
    fine_noise: float | None = None  # the action-noise ceiling in the steps ``fine`` marks (None: no such steps)

    def __init__(self, env, action_noise: float | None = None, target_noise: float = 0.0, seed: int = 0,
                 gain: float = 1.0, miss: float | None = None, detour: float | None = None, lift: str | None = None):
        self.action_noise = self.default_noise if action_noise is None else action_noise
        self.lift = self.default_lift if lift is None else lift
        if lift is not None and not self.grasps:
            raise UserError(f"the {type(self).__name__} does not grasp: lift is a setting of the pick experts")
        if self.lift not in LIFTS:
            raise UserError(f"lift is one of {', '.join(LIFTS)}, got {self.lift!r}")
        self.miss = self.default_miss if miss is None else miss
        self.detour = self.default_detour if detour is None else detour
        self.env, self.target_noise, self.gain = env, target_noise, gain
        self.generator = torch.Generator().manual_seed(seed)
        n = env.num_envs
        self.phase = torch.zeros(n, dtype=torch.long)
        self.timer = torch.zeros(n, dtype=torch.long)
        self.offset = torch.zeros(n, 3, dtype=F64)
        self.aim = torch.zeros(n, 3, dtype=F64)  # this episode's first grasp aimed off by this much (``miss``)
        # where this episode's carry goes first, from the goal in the table plane (``detour``; zero: straight there)
        self.via = torch.zeros(n, 2, dtype=F64)
        self.label: torch.Tensor | None = None  # the action of the last call without noise or aim-off
        # the gripper pointing down at yaw 0 (its x axis along the world's); a target orientation is Rz(yaw) @ down
        self.down = torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=F64))[None]

    def _restart(self) -> None:
        fresh = self.env.episode_length == 0
        if fresh.any():
            self.phase[fresh], self.timer[fresh] = 0, 0
            k = int(fresh.sum())
            off = torch.randn(k, 3, generator=self.generator, dtype=F64) * self.target_noise
            off[:, 2] = 0.0
            self.offset[fresh] = off
            angle = torch.rand(k, generator=self.generator, dtype=F64) * 2 * math.pi
            missed = torch.rand(k, generator=self.generator, dtype=F64) < self.miss
            aim = torch.stack([angle.cos(), angle.sin(), torch.zeros_like(angle)], 1) * MISS_OFFSET
            self.aim[fresh] = aim * missed[:, None]
            if self.detour > 0:  # drawn only then: the demonstrations without detours stay as they were
                angle = torch.rand(k, generator=self.generator, dtype=F64) * 2 * math.pi
                detoured = torch.rand(k, generator=self.generator, dtype=F64) < self.detour
                self.via[fresh] = torch.stack([angle.cos(), angle.sin()], 1) * DETOUR_OFFSET * detoured[:, None]

    def __call__(self, obs) -> torch.Tensor:
        """The executed action (noise and a missed grasp's aim-off in it); ``self.label`` the same without them, the
        action a demonstration records (DART: the states the perturbations lead to, labelled with the expert's
        correction)."""
        self._restart()
        target, yaw, gripper = self.plan()
        c = self.env.controller
        pos, rot = c.ee_pose()
        want = self.orientation(yaw, rot)
        dw = rotation_error(want, rot) / c.max_rotation
        label = torch.cat([self.gain * (target - pos) / c.max_translation, dw, gripper[:, None]], 1)
        noise = self.noise_std()[:, None] * torch.randn(label.shape, generator=self.generator, dtype=F64)
        action = label + noise
        aimed = (self.phase >= 1) & (self.phase <= 2)  # the descent and the grasp go to the aimed-off point
        action[:, :3] += self.gain * self.aim * aimed[:, None] / c.max_translation
        self.timer += 1
        self.label = label.clamp(-1.0, 1.0).float()
        return action.clamp(-1.0, 1.0).float()

    def noise_std(self) -> torch.Tensor:
        """``[N]``: this step's action-noise std per env: ``action_noise``, at most ``fine_noise`` where ``fine``."""
        coarse = torch.full((self.env.num_envs,), float(self.action_noise), dtype=F64)
        if self.fine_noise is None:
            return coarse
        return torch.where(self.fine(), coarse.clamp(max=self.fine_noise), coarse)

    def fine(self) -> torch.Tensor:
        """``[N]`` bool: the envs whose step needs precision (an insertion, a placement)."""
        return torch.zeros(self.env.num_envs, dtype=torch.bool)

    def orientation(self, yaw: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        """The gripper's target orientation ``[N, 3, 3]``: pointing down, turned by ``yaw``."""
        return axis_angle_matrix(torch.stack([torch.zeros_like(yaw), torch.zeros_like(yaw), yaw], 1)) @ self.down

    def _advance(self, mask: torch.Tensor) -> None:
        self.phase[mask] += 1
        self.timer[mask] = 0

    def grasp_yaw(self, obj_rot: torch.Tensor, grip_rot: torch.Tensor) -> torch.Tensor:
        """The gripper yaw nearest its current one that closes the fingers on a pair of the object's faces."""
        current = _yaw(grip_rot)
        return current + _fold(_yaw(obj_rot) - current, math.pi / 2)

    def plan(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per env: the grip point's target ``[N, 3]``, the gripper's target yaw ``[N]``, the gripper command."""
        raise NotImplementedError


class ReachExpert(Expert):
    def plan(self):
        pos, rot = self.env.controller.ee_pose()
        return self.env.goal + self.offset, _yaw(rot), -torch.ones(pos.shape[0], dtype=F64)


class PickExpert(Expert):
    """Approach above the object, descend, close, lift, carry over the goal, lower, open; a grasp that shut on nothing
    or an object dropped on the way starts over."""

    grasps = True
    min_hold = 2 * CUBE - 0.01  # [m] fingers closed narrower than this hold no cube (a grasp of it: ~4.1 cm)
    grasp_height = 0.0  # [m] grip point above the object's centre at the grasp
    place_clearance = 0.004  # [m] the object's centre above its goal when it is let go
    xy_tolerance = 0.005  # [m] the object over its goal in the table plane before it is lowered
    # [m] the fingers start closing this near the grasp point, while the grip point still moves to it: a demo
    # whose gripper closes only once the grip has arrived labels the arrival state both open (the last steps of
    # the descent) and closed (the first of the grasp), and a cloned policy comes to rest there with open fingers
    close_within = 0.012
    # from the grasp on (closing, lifting, carrying, placing), turn the hand to the yaw it grasped at and keep it
    # there; False: keep turning it to the object's faces, which a held object follows, so a cube held a little
    # turned from the fingers' line made the hand spin through the carry (mini-libero: ~0.3 rad over the lift's first
    # steps, labels of 0.5 of the full turn rate a step) and the clone's carries spun an off-centre grasp loose
    hold_yaw = False

    def __init__(self, env, **kwargs):
        super().__init__(env, **kwargs)
        self.held_yaw = torch.zeros(env.num_envs, dtype=F64)  # the yaw the grasp began at (``hold_yaw``)
        # [m] the object's aligned point from its goal in the table plane, as of the last ``plan``
        self.off_goal = torch.full((env.num_envs,), math.inf, dtype=F64)

    def plan(self):
        env = self.env
        grip, grip_rot = env.controller.ee_pose()
        obj, obj_rot = env.object_pose()
        n = grip.shape[0]
        goal = self.goal_target() + self.offset
        up = torch.tensor([0.0, 0.0, 1.0], dtype=F64)
        target = grip.clone()
        gripper = -torch.ones(n, dtype=F64)
        yaw = self.grasp_yaw(obj_rot, grip_rot)
        held = grip - obj  # the grip point relative to the object while carrying
        p = self.phase
        # dropped on the way (the object back on the table, away from the fingers), or the fingers closed past it:
        # start over (with the aim of the next grasp on the object)
        # (the grip point sits grasp_height over the object's centre in a good hold: a peg held 2.6-3 cm under it
        # tripped a plain 3 cm test and was let go in the air)
        lost = ((p >= 3) & (p <= 5) & ((held - up * self.grasp_height).norm(dim=1) > 0.03)) | \
            ((p == 2) & (self.timer >= CLOSE_STEPS) & (env.finger_opening() < self.min_hold))
        self.phase[lost] = 0
        self.aim[lost] = 0.0
        anchor = self.anchor(obj, obj_rot)  # the point of the object aligned over the goal
        self.off_goal = (anchor[:, :2] - goal[:, :2]).norm(dim=1)
        # 0: above the object
        above = obj + up * ABOVE
        target = torch.where((p == 0)[:, None], above, target)
        self._advance((p == 0) & ((grip - above).norm(dim=1) < 0.01) & (self._yaw_err(yaw, grip_rot) < 0.05))
        # 1: down to the grasp height
        at = obj + up * self.grasp_height
        target = torch.where((p == 1)[:, None], at, target)
        closing = (p == 1) & ((grip - at - self.aim).norm(dim=1) < self.close_within)  # where it aims
        self.held_yaw[closing] = yaw[closing]
        self._advance(closing)
        # 2: close, finishing the descent on the way; lift once the fingers had CLOSE_STEPS to close (timer), or as
        # soon as they hold the object (held: what the state shows; after the timer alone, the states of a closed
        # grasp are labelled both wait and lift, and a clone that cannot see the timer waits)
        target = torch.where((p == 2)[:, None], at, target)
        gripper = torch.where(p >= 2, torch.ones_like(gripper), gripper)
        closed = self.timer >= CLOSE_STEPS
        if self.lift == "held":
            opening = env.finger_opening()
            closed |= (opening >= self.min_hold) & (opening < self.min_hold + HOLD_BAND)
        self._advance((p == 2) & closed)
        # 3: lift
        lift = torch.cat([obj[:, :2] + held[:, :2], torch.full((n, 1), CARRY, dtype=F64)], 1)
        target = torch.where((p == 3)[:, None], lift, target)
        self._advance((p == 3) & (grip[:, 2] > CARRY - 0.01))
        # 4: over the goal (the object's centre over it, whatever the grasp offset); a detour first goes over a point
        # ``via`` from it, so that the demonstration also corrects toward the goal from that side
        to_anchor = grip[:, :2] - anchor[:, :2]
        over = torch.cat([goal[:, :2] + self.via + to_anchor, torch.full((n, 1), CARRY, dtype=F64)], 1)
        target = torch.where((p == 4)[:, None], over, target)
        arrived = (p == 4) & ((anchor[:, :2] - goal[:, :2] - self.via).norm(dim=1) < 0.005)
        self.via[arrived] = 0.0
        self._advance((p == 4) & (self.off_goal < self.xy_tolerance))
        # 5: lower onto / into the goal, correcting the alignment on the way
        lower = torch.cat([goal[:, :2] + to_anchor, goal[:, 2:] + held[:, 2:] + self.place_clearance], 1)
        target = torch.where((p == 5)[:, None], lower, target)
        self._advance((p == 5) & (obj[:, 2] < goal[:, 2] + self.place_clearance + 0.003))
        # 6: open and back off upwards
        gripper = torch.where(p >= 6, -torch.ones_like(gripper), gripper)
        target = torch.where((p >= 6)[:, None], torch.where((self.timer > CLOSE_STEPS)[:, None], grip + up * 0.03,
                                                            grip), target)
        if self.hold_yaw:
            yaw = torch.where(p >= 2, self.held_yaw, yaw)
        return target, yaw, gripper

    def _yaw_err(self, yaw: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        return _fold(yaw - _yaw(rot), 2 * math.pi).abs()

    def goal_target(self) -> torch.Tensor:
        return self.env.goal

    def anchor(self, obj: torch.Tensor, obj_rot: torch.Tensor) -> torch.Tensor:
        return obj


class PegExpert(PickExpert):
    """The pick expert with a grasp near the peg's top and a slow, aligned descent into the hole."""

    # the approach, grasp, lift and carry take ``action_noise`` (default 0.05: the expert places 95% of 64 episodes,
    # 98% at 0.03, 88% at 0.1); the insertion at most ``fine_noise``
    # (0.3 mm per step: the hole leaves 1 mm a side). With 0.01 throughout, 50 demonstrations covered so thin a
    # band of states that BC (3% on seed 0) lifted the peg past any demonstrated height and opened its fingers
    # there (it had only seen open fingers high up on the way down to a grasp): 83 of its 97 failures ended lying down
    default_noise = 0.05
    fine_noise = 0.01  # while inserting
    near_hole = 0.01  # [m] the peg's bottom this near over the hole: the fine alignment takes ``fine_noise``
    min_hold = 2 * PEG[0] - 0.006  # [m] (a grasp of the peg: ~2.1 cm)
    grasp_height = PEG[2] / 2  # [m] over the peg's centre: lower, the palm meets the peg's top; higher, the
    # fingertips meet the fixture before the success depth
    place_clearance = -0.01  # push 1 cm past the success depth
    xy_tolerance = 0.001

    def fine(self) -> torch.Tensor:
        near = self.off_goal < self.near_hole
        return (self.phase >= 5) | ((self.phase == 4) & near)  # aligning over the hole, lowered into it

    def anchor(self, obj, obj_rot):
        return obj - obj_rot[:, :, 2] * PEG[2]  # the bottom face's centre: a tilted peg enters with it first

    def orientation(self, yaw, rot):
        """While the peg is carried and inserted, turn the hand so that the peg stands upright: a peg that
        tilted in the fingers jams in a hole with 1 mm a side."""
        want = super().orientation(yaw, rot)
        held = (self.phase >= 4) & (self.phase <= 5)  # carried and inserted (not while it is lifted off the table)
        if not bool(held.any()):
            return want
        _, obj_rot = self.env.object_pose()
        axis = obj_rot[:, :, 2] * torch.sign(obj_rot[:, 2:3, 2])  # the peg's long axis, pointing up
        up = torch.tensor([0.0, 0.0, 1.0], dtype=F64).expand_as(axis)
        cross = torch.linalg.cross(axis, up)
        angle = torch.atan2(cross.norm(dim=1), (axis * up).sum(1))
        straighten = axis_angle_matrix(cross / cross.norm(dim=1, keepdim=True).clamp_min(1e-12) * angle[:, None])
        return torch.where(held[:, None, None], straighten @ rot, want)


class PushExpert(Expert):
    """Get behind the cube (opposite the goal), lower the closed gripper to the table, push along the line, the hand
    turned so its x axis lies along the line (at whatever yaw it had, the push turned the cube off the line more often
    and the restarts ran episodes out: 86-93% at default noise on 256 starts of each of five seeds; turned, 95-97%)."""

    def plan(self):
        env = self.env
        grip, grip_rot = env.controller.ee_pose()
        obj, obj_rot = env.object_pose()
        goal = env.goal + self.offset
        n = grip.shape[0]
        d = goal[:, :2] - obj[:, :2]
        d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-6)
        behind = torch.cat([obj[:, :2] - d * (CUBE + 0.03), torch.full((n, 1), CUBE, dtype=F64)], 1)
        p = self.phase
        # 0: above the point behind the cube; 1: down to it; 2: push through the goal
        high = behind + torch.tensor([0.0, 0.0, ABOVE], dtype=F64)
        target = torch.where((p == 0)[:, None], high, behind)
        self._advance((p == 0) & ((grip - high).norm(dim=1) < 0.01))
        self._advance((p == 1) & ((grip - behind).norm(dim=1) < 0.006))
        push = torch.cat([goal[:, :2] - d * (CUBE + 0.005), torch.full((n, 1), CUBE, dtype=F64)], 1)
        # off the line (the cube turned away): back to phase 0
        lateral = (grip[:, :2] - obj[:, :2]) - ((grip[:, :2] - obj[:, :2]) * d).sum(1, keepdim=True) * d
        lost = (p == 2) & (lateral.norm(dim=1) > 0.02)
        self.phase[lost] = 0
        target = torch.where((self.phase == 2)[:, None], push, target)
        # the push line's direction (either way along it: the turn is at most 90 degrees from the current yaw)
        current = _yaw(grip_rot)
        yaw = current + _fold(torch.atan2(d[:, 1], d[:, 0]) - current, math.pi)
        return target, yaw, torch.ones(n, dtype=F64)


class MiniLiberoExpert(PickExpert):
    """The pick expert on each env's target cube (``env.object_pose``) towards its goal point, which follows a
    support cube that moves; a lift ends at the carry height."""

    # the clones' slips were spun loose: with it the 10-demo pipeline (seeds 0-4) 88.0 -> 92.5% (README, stop 72)
    hold_yaw = True
    xy_tolerance = 0.003  # [m] a cube stacked on a 4 cm cube slides off from a few millimetres more
    place_clearance = 0.002
    # while lowering onto the goal and letting go: at the default 0.1 (3 mm per step) a cube stacked on another slid
    # off in 10 of 40 episodes (75% success), and a farthest cube carried to the plate failed in 16%; at 0.02 both 40/40
    fine_noise = 0.02

    def fine(self) -> torch.Tensor:
        return self.phase >= 5

    def goal_target(self) -> torch.Tensor:
        return self.env.goal_point()


EXPERTS = {ReachEnv: ReachExpert, PushEnv: PushExpert, PickPlaceEnv: PickExpert, PegInsertEnv: PegExpert}


def expert(env, **kwargs) -> Expert:
    """The scripted expert of ``env``'s task."""
    return EXPERTS[type(env)](env, **kwargs)
