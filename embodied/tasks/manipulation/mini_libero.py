"""``mini-libero``: a language-conditioned tabletop suite modelled on LIBERO's structure, on the Franka tabletop scene.

One scene for every task: four cubes (red, green, blue, yellow; 4 cm), a plate (9 x 9 cm) and a tray (10 x 10 cm),
both 1 cm high and placed per episode. 13 tasks in three groups, each with training phrasings and held-out
paraphrases (``phrasing=heldout`` evaluates on those):

- ``mini-libero-spatial`` (same objects, different layouts; LIBERO-Spatial): the cubes stand in a row across the
  table or in a column along it, their colours shuffled, and the instruction names the cube by where it stands
  (leftmost, rightmost, nearest the robot, farthest); it goes on the plate.
- ``mini-libero-object`` (different target objects; LIBERO-Object): a 2 x 2 grid with shuffled colours; the
  instruction names the cube by colour; it goes on the plate.
- ``mini-libero-goal`` (same layout, different goals; LIBERO-Goal): the grid with fixed colours; the goal differs
  (a cube on the plate, on the tray, on another cube, held up).
- ``mini-libero``: all 13.

Each env draws its task at every reset (uniformly from the suite's, from the env's generator), so one batch holds a
mix. Initial-state randomization (robot frame: x away from the robot base, y to its left; [m], [rad]):

- layouts: ``row`` slots y = -0.135 + 0.09 k (k = 0..3, k = 0 rightmost), x = 0.45, the row shifted by U(+-0.02)
  in x and U(+-0.03) in y, each cube by U(+-0.008); plate (0.63, 0.08), tray (0.63, -0.08), each U(+-0.02).
  ``column``: x = 0.36 + 0.085 k (k = 0 nearest the robot), y = -0.13, shifted by U(+-0.015) / U(+-0.03), each
  cube U(+-0.008); plate (0.42, 0.12), tray (0.60, 0.12), each U(+-0.02). ``grid``: x in {0.40, 0.52}, y in
  {-0.17, -0.05}, shifted U(+-0.02), each cube U(+-0.008); plate (0.42, 0.14), tray (0.60, 0.12), each U(+-0.02);
- every cube's yaw U(+-0.785) (a quarter turn: its symmetry); the arm's joints U(+-arm_noise) about home.

Success predicates: ``On(cube, support)`` is LIBERO's: the cube's centre over the support's top face, the cube at
its resting height on it within 3 mm and slower than 5 cm/s (a support cube's top follows that cube);
``Lifted(cube)``: the cube's centre 10 cm or more above the table.

Observation groups: ``policy`` is the proprioception (grip point, its rotation, finger opening), then either the
objects' state (``observation=state``: each cube's position, its position from the grip point, quarter-turn yaw
features and where it stood at the episode's start, the plate's and the tray's position and their positions from the
grip point; the relative positions lifted 10-demo BC from 5.4% to 6.9%, seed 0; the start positions keep a cube
named by where it stands the same cube once it is carried off: the rightmost cube carried to the plate is the
leftmost by then, and the 10-demo clones of seeds 0-2 went from 64.1% to 71.3% mean, spatial 36% -> 54%) or the
cameras' image (``observation=pixels``; agent view and wrist, stacked as channels), then the instruction's 384-d
MiniLM embedding (a term whose ``source`` is ``instruction``); ``text`` is that embedding again, ``[N, 384]``
float32; ``critic`` adds the objects' state, the goal point, the instructed cube's position and the goal point from
it (the cube the rewards measure, which a critic could only infer from the instruction's embedding), the arm's
joints and velocities. ``info["instruction"]`` lists each env's instruction string after every reset and step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from embodied.core.base import INSTRUCTED, TASK_ID
from embodied.core.errors import UserError
from embodied.core.layout import ActionTerm, Layout, Term
from embodied.core.pixels import pixels_to_float
from embodied.core.registry import TaskSpec, register_task
from embodied.tasks.manipulation.scene import Box, SceneSpec
from embodied.tasks.manipulation.tabletop import CUBE, F64, TabletopConfig, TabletopEnv, _place_upright, rot6

COLOURS = ("red", "green", "blue", "yellow")
CUBE_RGBA = ((0.85, 0.15, 0.15, 1.0), (0.15, 0.7, 0.2, 1.0), (0.15, 0.3, 0.9, 1.0), (0.95, 0.8, 0.1, 1.0))
PLATE = (0.045, 0.045, 0.005)  # [m] half extents
TRAY = (0.05, 0.05, 0.005)
SUPPORTS = ("plate", "tray", *COLOURS)  # what a cube can be put on: index into this
LIFT_HEIGHT = 0.10  # [m] Lifted: the cube's centre this far above the table
CUBE_JITTER = 0.008  # [m] each cube's own U(+-) about its slot
# [m] relabel_jitter's U(+-) on the plate and the tray: at test their place from the cubes spreads by the layout's
# shift (2-3 cm) and their own draw (2 cm)
SURFACE_JITTER = 0.04
LIFT_GOAL = 0.14  # [m] the goal point of a lift (where the expert carries it)
TEXT_DIM = 384


@dataclass(frozen=True)
class MiniTask:
    """One task: its group, where the objects stand, which cube, where it goes, and how it is said."""

    name: str
    group: str  # spatial | object | goal
    layout: str  # row | column | grid
    colours: str  # shuffled | fixed (red, green, blue, yellow in slots 0..3)
    target: str  # a colour, or "slot<k>": the cube standing in slot k
    goal: str  # a support (plate, tray, a colour: on that cube) or "lift"
    phrasings: tuple[str, ...]  # training instructions
    paraphrases: tuple[str, ...]  # held out


def _spatial(name, layout, slot, where, nearest):
    return MiniTask(name, "spatial", layout, "shuffled", f"slot{slot}", "plate",
                    (f"pick up the {where} cube and place it on the plate", f"put the {nearest} on the plate"),
                    (f"move the {where.replace('most', '-most')} block onto the plate",))


TASK_LIST = (
    _spatial("spatial-leftmost", "row", 3, "leftmost", "cube on the far left"),
    _spatial("spatial-rightmost", "row", 0, "rightmost", "cube on the far right"),
    MiniTask("spatial-nearest", "spatial", "column", "shuffled", "slot0", "plate",
             ("pick up the cube closest to the robot and place it on the plate", "put the nearest cube on the plate"),
             ("move the block nearest to you onto the plate",)),
    MiniTask("spatial-farthest", "spatial", "column", "shuffled", "slot3", "plate",
             ("pick up the cube farthest from the robot and place it on the plate",
              "put the farthest cube on the plate"),
             ("move the most distant block onto the plate",)),
    *(MiniTask(f"object-{c}", "object", "grid", "shuffled", c, "plate",
               (f"pick up the {c} cube and place it on the plate", f"put the {c} cube on the plate"),
               (f"move the {c} block onto the plate",)) for c in COLOURS),
    MiniTask("goal-red-plate", "goal", "grid", "fixed", "red", "plate",
             ("put the red cube onto the plate", "place the red cube on the plate"),
             ("set the red block down on the plate",)),
    MiniTask("goal-red-tray", "goal", "grid", "fixed", "red", "tray",
             ("put the red cube on the tray", "place the red cube in the tray"),
             ("set the red block down in the tray",)),
    MiniTask("goal-stack-green-blue", "goal", "grid", "fixed", "green", "blue",
             ("stack the green cube on the blue cube", "put the green cube on top of the blue cube"),
             ("place the green block on the blue block",)),
    MiniTask("goal-yellow-tray", "goal", "grid", "fixed", "yellow", "tray",
             ("put the yellow cube on the tray", "place the yellow cube in the tray"),
             ("set the yellow block down in the tray",)),
    MiniTask("goal-lift-blue", "goal", "grid", "fixed", "blue", "lift",
             ("pick up the blue cube and hold it up", "lift the blue cube"),
             ("raise the blue block off the table",)),
)
TASKS_BY_NAME = {t.name: t for t in TASK_LIST}
GROUPS = ("spatial", "object", "goal")
LAYOUTS = ("row", "column", "grid")


@dataclass
class MiniLiberoConfig(TabletopConfig):
    episode_steps: int = 150
    arm_noise: float = 0.05
    tasks: list[str] = field(default_factory=list)  # task names of the suite to draw from; empty: all of it
    phrasing: str = "train"  # train | heldout: which instructions an episode draws
    observation: str = "state"  # state | pixels
    image_size: int = 64  # [px] square camera images (pixels)
    success_bonus: float = 10.0
    # [m] relabelled copies (``bc.relabel``, ``filtered-bc.relabel``) also move the whole scene by an offset drawn
    # per copy, uniform in +-this on x and y (``core.relabel.PlanarShift``: every absolute position in the plane, the
    # grip point's, the cubes', where they stood, the plate's and the tray's); 0: the colours renamed only
    relabel_shift: float = 0.0
    # relabelled copies may also swap the plate's and the tray's names (their state entries exchanged): a cube put on
    # the plate is then a cube put on the tray (``renaming.py``). 1 demo a task, seed 0, shift 0.03: BC 11.5 -> 13.8%,
    # filtered-bc 30.0 -> 25.4% (issue 13, stop 75): off
    relabel_surfaces: bool = False
    # this share of the relabelled copies of an episode that moves a cube named by its colour are copies of its steps
    # before the cube is first 10 cm up as an episode of the lift, the cube renamed to the lift's (``renaming.py``:
    # every carry lifts its cube to 14 cm); 0: none. 1 demo a task, seeds 0 / 1, 0.125: the lift after filtered-bc 0 ->
    # 0.67 / 0.50, the suite 30.0 / 36.2 -> 27.7 / 36.9% from clones of 11.5 / 14.6 -> 12.3 / 19.2% (issue 13, stop 75):
    # off
    relabel_lifts: float = 0.0
    # this share of the relabelled copies are mirror images (y -> -y, the world-frame motions mirrored with them,
    # ``renaming.Mirror``): a row's rightmost-cube episode becomes a leftmost one, every other task one of itself in
    # the mirrored layout; 0: none. 1 demo a task, 0.25, seeds 0 / 1 / 2: BC 10.0 / 27.7 / 10.0%, filtered-bc 42.3 /
    # 46.9 / 46.2% (without: 11.5 / 14.6 / 5.4 -> 30.0 / 36.2 / 19.2%; issue 13, stop 76); off: 10 demos a task, the
    # BC ensembles of seeds 0 / 1 77.7 / 99.2% (without: 90.8 / 98.5%), filtered-bc from them unmeasured
    relabel_mirror: float = 0.0
    # this share of the relabelled copies are reach prefixes (the steps before the moved cube rises) with the other
    # cubes jittered by U(+-8 mm) each and the plate and the tray by U(+-4 cm) each (``renaming.ReachJitter``: a
    # reach depends on its cube alone, and one demonstration holds its cube and its goal at one relative placement,
    # which at test spreads by the layout's shift and the surfaces' own draws); 0: none. 1 demo a task, seed 0, 0.25:
    # BC 16.9%, filtered-bc 33.8% (without: 11.5 -> 30.0%; in-run below from 200k; issue 13, stop 76): off
    relabel_jitter: float = 0.0


def _layout_slots(layout: str, k: int, uniform) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cube slots ``[k, 4, 2]``, plate and tray centres ``[k, 2]`` of one layout for ``k`` envs."""
    if layout == "row":
        base = torch.tensor([[0.45, -0.135 + 0.09 * i] for i in range(4)], dtype=F64)
        shift, plate, tray = uniform(k, [0.02, 0.03]), (0.63, 0.08), (0.63, -0.08)
    elif layout == "column":
        base = torch.tensor([[0.36 + 0.085 * i, -0.13] for i in range(4)], dtype=F64)
        shift, plate, tray = uniform(k, [0.015, 0.03]), (0.42, 0.12), (0.60, 0.12)
    else:  # grid
        base = torch.tensor([[x, y] for x in (0.40, 0.52) for y in (-0.17, -0.05)], dtype=F64)
        shift, plate, tray = uniform(k, [0.02, 0.02]), (0.42, 0.14), (0.60, 0.12)
    slots = base + shift[:, None] + uniform(k * 4, [CUBE_JITTER, CUBE_JITTER]).view(k, 4, 2)
    return (slots, torch.tensor(plate, dtype=F64) + uniform(k, [0.02, 0.02]),
            torch.tensor(tray, dtype=F64) + uniform(k, [0.02, 0.02]))


class MiniLiberoEnv(TabletopEnv):
    object_name = None

    def __init__(self, cfg: MiniLiberoConfig, num_envs: int, device="cpu", seed: int = 0):
        from embodied.vla.text import InstructionTable

        suite = [t for t in TASK_LIST if self.group in ("all", t.group)]
        if cfg.tasks:
            unknown = [n for n in cfg.tasks if n not in {t.name for t in suite}]
            if unknown:
                raise UserError(f"{self.task_name}: unknown task(s) {', '.join(unknown)}; its tasks: "
                                f"{', '.join(t.name for t in suite)}")
            suite = [t for t in suite if t.name in cfg.tasks]
        for key in ("relabel_lifts", "relabel_mirror", "relabel_jitter"):
            if not 0 <= getattr(cfg, key) <= 1:
                raise UserError(f"{key} is a share of the relabelled copies: in [0, 1], got {getattr(cfg, key)}")
        if not cfg.relabel_shift >= 0:
            raise UserError(f"relabel_shift is a distance [m]: >= 0, got {cfg.relabel_shift}")
        if cfg.phrasing not in ("train", "heldout"):
            raise UserError(f"phrasing must be train or heldout, got {cfg.phrasing!r}")
        if cfg.observation not in ("state", "pixels"):
            raise UserError(f"observation must be state or pixels, got {cfg.observation!r}")
        self.suite = suite
        self.num_tasks = len(suite)
        self.instructions = InstructionTable([s for t in TASK_LIST for s in (*t.phrasings, *t.paraphrases)])
        phr = [t.phrasings if cfg.phrasing == "train" else t.paraphrases for t in suite]
        self.phrase_rows = [torch.tensor([self.instructions.index[s] for s in p]) for p in phr]
        # per task: layout index, whether colours are shuffled, target (colour index or slot), goal support or lift
        self.t_layout = torch.tensor([LAYOUTS.index(t.layout) for t in suite])
        self.t_shuffled = torch.tensor([t.colours == "shuffled" for t in suite])
        self.t_slot = torch.tensor([int(t.target[4:]) if t.target.startswith("slot") else -1 for t in suite])
        self.t_colour = torch.tensor([COLOURS.index(t.target) if t.target in COLOURS else -1 for t in suite])
        self.t_support = torch.tensor([SUPPORTS.index(t.goal) if t.goal != "lift" else -1 for t in suite])
        n = num_envs
        self.task_id = torch.zeros(n, dtype=torch.long)
        self.target = torch.zeros(n, dtype=torch.long)  # the cube to move (colour index)
        self.support = torch.zeros(n, dtype=torch.long)  # index into SUPPORTS, -1: lift
        self.instruction_row = torch.zeros(n, dtype=torch.long)
        self.cubes_xy = torch.zeros(n, 4, 2, dtype=F64)  # where each cube stood at the episode's start
        self.surface_xy = torch.zeros(n, 2, 2, dtype=F64)  # plate and tray centres
        super().__init__(cfg, num_envs, device, seed)

    # ---- scene -------------------------------------------------------------------------------
    def scene(self) -> SceneSpec:
        cubes = [Box(c, (CUBE,) * 3, (0.45, -0.135 + 0.09 * i, CUBE), rgba=CUBE_RGBA[i], mass=0.05)
                 for i, c in enumerate(COLOURS)]
        return SceneSpec([*cubes, Box("plate", PLATE, (0.63, 0.08, PLATE[2]), rgba=(0.92, 0.92, 0.9, 1), mass=0,
                                      movable=True),
                          Box("tray", TRAY, (0.63, -0.08, TRAY[2]), rgba=(0.25, 0.22, 0.2, 1), mass=0, movable=True)])

    def _setup(self) -> None:
        m = self.sim.model
        self.renderer = None
        if self.cfg.observation == "pixels":  # both cameras of every env, batched (kernels/mesh_raster_numba.py)
            from embodied.sim_backends.mujoco_cpu.batch_render import BatchRenderer
            from embodied.tasks.manipulation.scene import CAMERAS

            if not 16 <= self.cfg.image_size <= 256:
                raise UserError(f"image_size must be in 16..256, got {self.cfg.image_size}")
            self.renderer = BatchRenderer(self.sim, CAMERAS, self.cfg.image_size)
        self.cube_body = torch.tensor([m.body(c).id for c in COLOURS])
        self.cube_qpos = [int(m.jnt_qposadr[m.body(c).jntadr[0]]) for c in COLOURS]
        self.cube_dof = torch.tensor([int(m.jnt_dofadr[m.body(c).jntadr[0]]) for c in COLOURS])
        self.surface_mocap = [int(m.body(s).mocapid[0]) for s in ("plate", "tray")]

    # ---- the state of a task -------------------------------------------------------------------
    def cube_poses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``[N, 4, 3]`` and rotations ``[N, 4, 3, 3]`` of the cubes (colour order)."""
        return self.xpos[:, self.cube_body].clone(), self.xmat[:, self.cube_body].reshape(-1, 4, 3, 3).clone()

    def object_pose(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pose of each env's target cube (what the expert picks)."""
        pos, rot = self.cube_poses()
        rows = torch.arange(self.num_envs)
        return pos[rows, self.target], rot[rows, self.target]

    def goal_point(self) -> torch.Tensor:
        """``[N, 3]``: where the target cube's centre rests when the goal holds (a lift: where it is held), as of
        now (a support cube may have moved)."""
        pos, _ = self.cube_poses()
        rows = torch.arange(self.num_envs)
        on_cube = (self.support >= 2)
        cube_top = pos[rows, (self.support - 2).clamp_min(0)]
        surface = self.surface_xy[rows, self.support.clamp(0, 1)]
        xy = torch.where(on_cube[:, None], cube_top[:, :2], surface)
        z = torch.where(on_cube, cube_top[:, 2] + 2 * CUBE, torch.full_like(cube_top[:, 2], 2 * PLATE[2] + CUBE))
        goal = torch.cat([xy, z[:, None]], 1)
        start = self.cubes_xy[rows, self.target]  # the target cube's start: a lift's goal is above it
        lift = torch.cat([start, torch.full((self.num_envs, 1), LIFT_GOAL, dtype=F64)], 1)
        return torch.where((self.support < 0)[:, None], lift, goal)

    def _success(self) -> torch.Tensor:
        obj, _ = self.object_pose()
        rows = torch.arange(self.num_envs)
        goal = self.goal_point()
        half = torch.tensor([PLATE[0], TRAY[0], CUBE, CUBE, CUBE, CUBE], dtype=F64)[self.support.clamp_min(0)]
        over = ((obj[:, :2] - goal[:, :2]).abs() < half[:, None]).all(1)
        speed = self.sim.qvel[rows[:, None], self.cube_dof[self.target][:, None] + torch.arange(3)].norm(dim=1)
        resting = ((obj[:, 2] - goal[:, 2]).abs() < 0.003) & (speed < 0.05)
        lifted = obj[:, 2] > LIFT_HEIGHT
        return torch.where(self.support < 0, lifted, over & resting)

    # ---- ManagedVecEnv hooks ---------------------------------------------------------------------
    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        k, m, cfg = env_ids.numel(), self.sim.model, self.cfg
        tid = torch.randint(len(self.suite), (k,), generator=self.generator)
        if self.reset_task is not None:  # told by reset_envs (the draw above still made: the rest is the seed's)
            tid.fill_(self.reset_task)
        qpos = self.home.expand(k, -1).clone()
        qpos[:, :7] += self._uniform(k, [cfg.arm_noise] * 7)
        slots = torch.zeros(k, 4, 2, dtype=F64)
        surfaces = torch.zeros(k, 2, 2, dtype=F64)
        lay = self.t_layout[tid]
        for li, name in enumerate(LAYOUTS):  # one batched draw per layout
            sel = (lay == li).nonzero().squeeze(-1)
            if sel.numel():
                s, p, t = _layout_slots(name, sel.numel(), self._uniform)
                slots[sel], surfaces[sel, 0], surfaces[sel, 1] = s, p, t
        # colour c stands in slot perm[c]: shuffled, or the fixed order
        perm = torch.rand(k, 4, generator=self.generator).argsort(1)
        perm = torch.where(self.t_shuffled[tid][:, None], perm, torch.arange(4).expand(k, 4))
        xy = slots.gather(1, perm[:, :, None].expand(k, 4, 2))  # [k, colour, 2]
        yaw = self._uniform(k * 4, [math.pi / 4]).view(k, 4)
        for c, adr in enumerate(self.cube_qpos):
            _place_upright(qpos, adr, xy[:, c], CUBE, yaw[:, c])
        slot = self.t_slot[tid]
        by_slot = (perm == slot.clamp_min(0)[:, None]).float().argmax(1)  # the colour standing in that slot
        target = torch.where(slot >= 0, by_slot, self.t_colour[tid])
        phrase = torch.stack([self.phrase_rows[int(t)][int(torch.randint(len(self.phrase_rows[int(t)]), (1,),
                                                                                 generator=self.generator))]
                              for t in tid]) if k else torch.zeros(0, dtype=torch.long)
        self.task_id[env_ids], self.target[env_ids], self.support[env_ids] = tid, target, self.t_support[tid]
        self.instruction_row[env_ids] = phrase
        self.cubes_xy[env_ids] = xy
        self.surface_xy[env_ids] = surfaces
        self._place_goal(env_ids)
        self.succeeded[env_ids] = False
        self.sim.set_state_idx(env_ids, torch.cat([qpos, torch.zeros(k, m.nv, dtype=F64)], 1))
        self.sim.ctrl[env_ids] = self.home_ctrl

    def _place_goal(self, env_ids: torch.Tensor) -> None:
        for i, (mocap, half) in enumerate(zip(self.surface_mocap, (PLATE, TRAY))):
            self.mocap_pos[env_ids, mocap, :2] = self.surface_xy[env_ids, i]
            self.mocap_pos[env_ids, mocap, 2] = half[2]

    def _objects_state(self) -> torch.Tensor:
        pos, rot = self.cube_poses()
        yaw = torch.atan2(rot[..., 1, 0], rot[..., 0, 0])
        grip = self.controller.ee_pose()[0][:, None]
        cubes = torch.cat([pos, pos - grip, torch.cos(4 * yaw)[..., None], torch.sin(4 * yaw)[..., None],
                           self.cubes_xy], 2)
        surfaces = torch.cat([self.surface_xy, torch.tensor([2 * PLATE[2], 2 * TRAY[2]], dtype=F64)
                              .expand(self.num_envs, 2)[..., None]], 2)
        return torch.cat([cubes.flatten(1), torch.cat([surfaces, surfaces - grip], 2).flatten(1)], 1)

    def _observe(self):
        grip, rot = self.controller.ee_pose()
        proprio = torch.cat([grip, rot6(rot), self.finger_opening()[:, None]], 1)
        objects = self._objects_state()
        text = self.instructions.embed(self.instruction_row)
        if self.renderer is not None:  # [N, cameras, H, W, 3] uint8 -> channel-major floats in [0, 1]
            images = self.renderer.render(self.sim)
            image = pixels_to_float(images.permute(0, 1, 4, 2, 3).reshape(self.num_envs, -1))
            policy = torch.cat([proprio.float(), image, text], 1)
        else:
            policy = torch.cat([proprio.float(), objects.float(), text], 1)
        s, c = self.sim, self.controller
        goal, target = self.goal_point(), self.object_pose()[0]
        critic = torch.cat([proprio, objects, goal, target, goal - target, s.qpos[:, c.arm_qpos], s.qvel[:, c.arm_dof]],
                           1)
        return {"policy": policy, "critic": torch.cat([critic.float(), text], 1), "text": text.clone()}

    def _compute(self, action: torch.Tensor):
        from embodied.core.base import StepTerms

        grip, _ = self.controller.ee_pose()
        obj, _ = self.object_pose()
        goal = self.goal_point()
        success = self._success()
        lifted = (obj[:, 2] > CUBE + 0.01).to(F64)
        terms = {"reach": -0.5 * (obj - grip).norm(dim=1), "lift": -0.5 * (1.0 - lifted),
                 "place": -(goal - obj).norm(dim=1),
                 "action": -self.cfg.action_cost * (action.to(F64) ** 2).sum(1),
                 "success": self.cfg.success_bonus * success.to(F64)}
        self.succeeded = success.clone()
        pos, _ = self.cube_poses()
        dropped = (pos[:, :, 2] < -0.05).any(1)
        terms["dropped"] = -self.cfg.success_bonus * dropped.to(F64)
        metrics = {"success_rate": success.to(F64), "dropped": dropped.to(F64)}
        return StepTerms(terms, success | dropped, metrics)

    def instructed(self) -> torch.Tensor:
        """``[N, 2]``: the instructed cube and what it goes onto (-1 for a lift) as indices into the entities of the
        state layout (the four cubes in colour order, then plate and tray: ``SUPPORTS`` puts the surfaces first)."""
        surface = self.support + len(COLOURS)  # plate, tray
        onto = torch.where(self.support >= 2, self.support - 2, torch.where(self.support >= 0, surface, -1))
        return torch.stack([self.target, onto], 1)

    def _final_info(self, done):
        told = self.instructed().float()
        return {"success": self.succeeded.float(), TASK_ID: self.task_id.float(),
                INSTRUCTED[0]: told[:, 0], INSTRUCTED[1]: told[:, 1]}

    def step(self, action):
        out = super().step(action)
        out[4]["instruction"] = self.instruction_strings()
        return out

    def reset(self, seed=None):
        obs, info = super().reset(seed)
        info["instruction"] = self.instruction_strings()
        return obs, info

    def instruction_strings(self) -> list[str]:
        return [self.instructions.texts[int(i)] for i in self.instruction_row]

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.suite]

    # ---- layout and checkpoints -----------------------------------------------------------------
    def layout(self) -> Layout:
        proprio = (Term("grip_pos", 3, "m", "world", "the grip point between the finger pads"),
                   Term("grip_rot6", 6, "1", "world", "first two columns of the gripper's rotation"),
                   Term("finger_opening", 1, "m", "", "distance between the finger pads"))
        objects = (*(Term(f"{c}_cube", 10, "m|1", "world", "position, position from the grip point, cos and sin of "
                          "4 x yaw, where it stood at the episode's start (x, y)") for c in COLOURS),
                   Term("plate_pos", 6, "m", "world", "position, position from the grip point"),
                   Term("tray_pos", 6, "m", "world", "position, position from the grip point"))
        text = Term("instruction", TEXT_DIM, "1", "", "MiniLM embedding of the instruction", source="instruction")
        size = self.cfg.image_size
        image = Term("cameras", 6 * size * size, "1", "", "agentview then wrist RGB in [0, 1], channel-major",
                     shape=(6, size, size), quantized=True)
        action = (ActionTerm("ee_translation", 3, "m", scale=self.cfg.max_translation),
                  ActionTerm("ee_rotation", 3, "rad", scale=self.cfg.max_rotation),
                  ActionTerm("gripper", 1, "1", description="> 0 closes"))
        obs = {"policy": (*proprio, image, text) if self.renderer is not None else (*proprio, *objects, text),
               "critic": (*proprio, *objects, Term("goal_point", 3, "m", "world"),
                          Term("target_cube", 6, "m", "world", "the instructed cube's position, then the goal point "
                               "from it: which cube the rewards measure"),
                          Term("arm_qpos", 7, "rad"), Term("arm_qvel", 7, "rad/s"), text),
               "text": (text,)}
        return Layout(obs, action, self.cfg.control_hz, notes=f"tasks: {', '.join(self.task_names)}",
                      extras={"instructions": self.instructions.texts})

    def relabeller(self):
        """The cubes' colours renamed (``renaming.py``; with ``relabel_surfaces`` the plate's and the tray's too, with
        ``relabel_lifts`` prefixes as the lift), with ``relabel_mirror`` some copies mirrored, with ``relabel_jitter``
        some reach prefixes with all but the moved cube jittered, then with ``relabel_shift`` the scene moved in the
        plane; None with image observations."""
        from embodied.core.relabel import Chain, PlanarShift
        from embodied.tasks.manipulation.renaming import ColourRenaming, Mirror, ReachJitter

        if self.renderer is not None:
            return None
        at = self.layout().slices("policy")
        cubes = [at[f"{c}_cube"] for c in COLOURS]  # consecutive, in colour order
        plate, tray = at["plate_pos"], at["tray_pos"]
        renaming = ColourRenaming(self.suite, self.instructions.table, self.instructions.index,
                                  (cubes[0].start, cubes[0].stop - cubes[0].start), at["instruction"].start,
                                  (plate.start, tray.start, plate.stop - plate.start) if self.cfg.relabel_surfaces
                                  else None, lifts=self.cfg.relabel_lifts)
        # the absolute x entries (y: the next): the grip point, each cube's position and where it stood (its term's
        # last two entries), the plate's, the tray's
        x = [at["grip_pos"].start, *(i for c in cubes for i in (c.start, c.stop - 2)), plate.start, tray.start]
        chain = [renaming]
        if self.cfg.relabel_mirror:
            chain.append(Mirror(self.suite, self.instructions.table, self.instructions.index, at["instruction"].start,
                                *self._mirror_map(at, [i + 1 for i in x]), self.cfg.relabel_mirror))
        if self.cfg.relabel_jitter:
            chain.append(ReachJitter((cubes[0].start, cubes[0].stop - cubes[0].start),
                                     (plate.start, tray.start, plate.stop - plate.start), CUBE_JITTER, SURFACE_JITTER,
                                     self.cfg.relabel_jitter))
        if self.cfg.relabel_shift:
            chain.append(PlanarShift(x, [i + 1 for i in x], self.cfg.relabel_shift))
        return chain[0] if len(chain) == 1 else Chain(*chain)

    @staticmethod
    def _mirror_map(at: dict[str, slice], ys: list[int]) -> tuple[list[int], list[float], list[float]]:
        """The policy observation (state) under y -> -y as a signed permutation (index, sign): the absolute y entries
        ``ys`` and every position from the grip point's y negated, each cube's sin(4 yaw) negated (its yaw is), and the
        gripper's rotation R -> M R M Rz(90 deg) (M = diag(1, -1, 1)): its rot6 columns (c0, c1) -> (-M c1, -M c0);
        then the action's signs: dy and the rotation's x and z (an axial vector) negated."""
        dim = max(s.stop for s in at.values())
        index, sign = list(range(dim)), [1.0] * dim
        cubes = [s for name, s in at.items() if name.endswith("_cube")]
        for i in (*ys, *(c.start + 4 for c in cubes), *(c.start + 7 for c in cubes), at["plate_pos"].start + 4,
                  at["tray_pos"].start + 4):
            sign[i] = -1.0
        r = at["grip_rot6"].start
        for j, (src, sg) in enumerate(zip((3, 4, 5, 0, 1, 2), (-1.0, 1.0, -1.0, -1.0, 1.0, -1.0))):
            index[r + j], sign[r + j] = r + src, sg
        return index, sign, [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]

    def _state_keys(self) -> tuple[str, ...]:  # checkpoints and restorable states carry them (TabletopEnv)
        return (*super()._state_keys(), "task_id", "target", "support", "instruction_row", "cubes_xy",
                "surface_xy")


def _expert(env, **kwargs):
    from embodied.tasks.manipulation.experts import MiniLiberoExpert

    return MiniLiberoExpert(env, **kwargs)


SUITES = {"mini-libero": "all", **{f"mini-libero-{g}": g for g in GROUPS}}
for _name, _group in SUITES.items():
    _cls = type(f"MiniLibero{_group.capitalize()}Env", (MiniLiberoEnv,), {"group": _group, "task_name": _name})
    register_task(TaskSpec(name=_name, make=_cls, config_cls=MiniLiberoConfig,
                           description=f"language-conditioned Franka tabletop suite ({_group}): "
                                       f"{sum(_group in ('all', t.group) for t in TASK_LIST)} tasks",
                           backends=("mujoco_cpu",), success_metric="success", default_algo="bc",
                           tags=("mujoco", "manipulation", "language"), expert=_expert))
