"""The tabletop scene as one MJCF string: the Franka Panda of gymnasium-robotics' kitchen environment (its MJCF and
meshes ship in the ``gymnasium-robotics`` wheel; the ``mujoco-menagerie`` wheel downloads its models at run time),
mounted at the edge of a table, and the objects of a task.

The robot's files are inlined (their ``<mujocoinclude>`` bodies) with the mesh directory made absolute, so the
model compiles from a string in any working directory. Changes to the robot, all stated:

- gravity compensation on the arm's bodies (``gravcomp="1"``): the real Panda's controller compensates gravity, and
  without it the position servos sag by centimetres, depending on the pose (the 2 mm peg clearance needs less);
- nothing in the fingers: they touch what has ``conaffinity=1`` (the kitchen model's finger geoms have
  ``conaffinity=0``), as every object here has;
- stiffer joint servos (``kp`` 5000 / 1000 for the shoulder / forearm joints instead of 870 / 120, joint damping
  60 / 6 instead of 100 / 10): the kitchen's servos covered a third of a 2 cm end-effector step in one 50 ms
  control period, these cover it (force limits unchanged);
- the base link does not collide with the table it stands on;
- a task may squeeze harder (``SceneSpec.finger_kp``; peg-insert: 2000, 20 N a finger on the 2 cm peg).

World frame: the table top is the plane z = 0 (the floor 0.8 m below), the robot base at the origin, x points
away from the robot.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from functools import cache

from embodied.core.errors import UserError

TIMESTEP = 0.002  # [s] physics step
ARM_JOINTS = tuple(f"robot:panda0_joint{i}" for i in range(1, 8))
FINGER_JOINTS = ("robot:panda0_finger_joint1", "robot:panda0_finger_joint2")
EE_SITE = "grip"  # between the finger pads, on link 7 (the controlled point)
FINGER_OPEN = 0.04  # [m] per finger
# a ready pose: the grip point 0.45 m in front of the base, 0.25 m above the table, pointing down
HOME_QPOS = (0.0, -0.2383, 0.0, -2.4528, 0.0, 0.6435, 0.7854)
# the wrist camera in the frame of the last link (its z axis runs along the fingers): position, xyaxes
WRIST_CAMERA = ("0.0 -0.09 0.08", "0.7071 0.7071 0 0.6124 -0.6124 -0.5")
CAMERAS = ("agentview", "wrist")  # what the language tasks see, stacked as channels


@cache
def franka_dir() -> str:
    found = importlib.util.find_spec("gymnasium_robotics")  # not imported: it registers (and warns about) its envs
    if found is None:
        raise UserError("the manipulation tasks need the Franka model of gymnasium-robotics: "
                        "pip install gymnasium-robotics")
    path = os.path.join(found.submodule_search_locations[0], "envs", "assets", "kitchen_franka", "franka_assets")
    if not os.path.isdir(path):
        raise UserError(f"gymnasium-robotics has no Franka assets at {path}")
    return path


def _inner(name: str) -> str:
    """The body of one of the robot's ``<mujocoinclude>`` files."""
    text = open(os.path.join(franka_dir(), name)).read()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.search(r"<mujocoinclude>(.*)</mujocoinclude>", text, flags=re.S).group(1)


@dataclass
class Box:
    """A box, free (``mass`` > 0) or fixed to the table (``mass`` = 0, ``movable``: placed by the task per env);
    ``pos`` of its centre."""

    name: str
    size: tuple[float, float, float]  # half extents [m]
    pos: tuple[float, float, float]
    rgba: tuple[float, float, float, float] = (0.8, 0.2, 0.2, 1.0)
    mass: float = 0.05  # [kg]
    friction: float = 1.0
    movable: bool = False  # a fixed box (mass 0) the task places per env at reset (a mocap body)

    def xml(self) -> str:
        geom = (f'<geom name="{self.name}" type="box" size="{_v(self.size)}" rgba="{_v(self.rgba)}" '
                f'friction="{self.friction} 0.005 0.0001" contype="1" conaffinity="1" condim="4"')
        if self.movable:
            return f'<body name="{self.name}" pos="{_v(self.pos)}" mocap="true">{geom}/></body>'
        if self.mass > 0:
            return (f'<body name="{self.name}" pos="{_v(self.pos)}"><freejoint name="{self.name}"/>'
                    f'{geom} mass="{self.mass}"/></body>')
        return f'<body name="{self.name}" pos="{_v(self.pos)}">{geom}/></body>'


@dataclass
class Marker:
    """A goal site: drawn, never touched."""

    name: str
    pos: tuple[float, float, float]
    size: float = 0.02
    rgba: tuple[float, float, float, float] = (0.1, 0.8, 0.1, 0.4)

    def xml(self) -> str:
        return (f'<body name="{self.name}" pos="{_v(self.pos)}" mocap="true"><site name="{self.name}" '
                f'type="sphere" size="{self.size}" rgba="{_v(self.rgba)}"/></body>')


@dataclass
class SceneSpec:
    objects: list = field(default_factory=list)  # Box and Marker, in order
    table_half: tuple[float, float] = (0.6, 0.6)  # [m] the table top around (0.45, 0)
    # the finger servos' stiffness [N/m]: closed on an object of width w, each finger squeezes with finger_kp * w / 2
    # (the Franka Hand grasps with a commanded force, up to its 70 N limit, which stays); the kitchen model's 500
    finger_kp: float = 500.0


def _v(values) -> str:
    return " ".join(f"{v:g}" for v in values)


def build_mjcf(spec: SceneSpec) -> str:
    """The scene's MJCF string."""
    robot = _inner("chain.xml").replace('<body name="panda0_link0" childclass="panda" >',
                                        '<body name="panda0_link0" childclass="panda">')
    # every arm body compensates its own weight (the Panda's controller does)
    robot = re.sub(r'<body name="(panda0_link\d|panda0_\w+finger)"', r'<body gravcomp="1" name="\1"', robot)
    # the grip point: between the finger pads, 1.5 cm above the fingertips (the kitchen's end_effector site is at
    # the palm, 5 cm above them)
    robot = robot.replace("<site name='end_effector'", f"<site name='{EE_SITE}' pos='0 0 .245' size='0.005' "
                          "euler='0 0 -0.785398' rgba='1 0 0 0.5' group='4'/>"
                          # the wrist camera: on the hand, beside the fingers, looking along them
                          f"<camera name='wrist' pos='{WRIST_CAMERA[0]}' xyaxes='{WRIST_CAMERA[1]}' fovy='80'/>"
                          "<site name='end_effector'")
    assets = _inner("assets.xml").replace('meshdir="franka_assets/meshes"',
                                          f'meshdir="{os.path.join(franka_dir(), "meshes")}"')
    assets = assets.replace('<option timestep="0.002"/>', "")
    assets = assets.replace('<joint damping="100"/>', '<joint damping="60"/>', 1)
    assets = assets.replace('<joint damping="10"/>', '<joint damping="6"/>', 1)
    actuators = _inner("actuator.xml").replace('kp="870"', 'kp="5000"').replace('kp="120"', 'kp="1000"')
    actuators = actuators.replace('kp="500" forcerange="-70 70"', f'kp="{spec.finger_kp:g}" forcerange="-70 70"')
    tx, ty = spec.table_half
    objects = "\n".join(o.xml() for o in spec.objects)
    return f"""<mujoco model="tabletop">
{assets}
  <option timestep="{TIMESTEP}" integrator="implicitfast" cone="elliptic" impratio="10"/>
  <visual><global offwidth="640" offheight="480"/></visual>
  <worldbody>
    <light pos="0.5 0 1.5" dir="0 0 -1" diffuse="0.8 0.8 0.8"/>
    <camera name="front" pos="1.9 0 0.9" xyaxes="0 1 0 -0.45 0 1"/>
    <camera name="agentview" pos="1.15 0 0.75" xyaxes="0 1 0 -0.69 0 0.72" fovy="50"/>
    <geom name="floor" type="plane" pos="0 0 -0.8" size="3 3 0.1" rgba="0.3 0.3 0.3 1"/>
    <body name="table" pos="0.45 0 -0.025">
      <geom name="table" type="box" size="{tx:g} {ty:g} 0.025" rgba="0.55 0.45 0.35 1" contype="1" conaffinity="1"/>
    </body>
    {robot}
    {objects}
  </worldbody>
  <contact><exclude body1="panda0_link0" body2="table"/></contact>
  {actuators}
</mujoco>"""
