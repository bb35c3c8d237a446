"""The robot contract (DESIGN.md, "Robot"): a driver chosen by URI, used as a context manager.

    with make_robot("sim://quadrotor-hover?mass=1.2") as robot:
        robot.arm()
        s = robot.observe()                  # RobotState: the layout's robot terms, a sequence number, a time
        applied = robot.send_action(a)       # what the robot applied

Drivers register their URI scheme in ``embodied.core.registry.ROBOTS``. What "hold" and "land" mean is the
driver's (an autopilot's own modes, or open-loop actions the task's layout names); the control loop
(``hardware/loop.py``) decides when."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from embodied.core.errors import UserError
from embodied.core.layout import Layout
from embodied.core.registry import ROBOTS, TASKS


@dataclass
class RobotState:
    values: np.ndarray  # float32: the layout's robot terms of the policy group, in order
    seq: int  # increases with every fresh reading; the same number again means no new state
    t: float  # time.monotonic() of the reading [s]
    info: dict = field(default_factory=dict)  # driver extras


class RobotError(RuntimeError):
    """A link, driver or runtime fault (not the user's input): deploy exits non-zero."""


class Robot(abc.ABC):
    """A driver. Subclasses implement the abstract verbs; ``layout`` is what the robot reports and accepts
    (for a simulated robot, its task's), checked against a bundle's before flight."""

    scheme: str = ""
    layout: Layout
    onboard_policy = False  # True: the robot runs the policy itself (``policy_action``), the HAL does not

    def __init__(self, uri: str):
        self.uri = uri
        self.armed = False

    # ---- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Robot:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.armed:
                self.disarm()
        finally:
            self.close()

    @abc.abstractmethod
    def connect(self) -> None:
        """Open the link; raise ``UserError`` when the robot cannot be reached."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def arm(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        """Motors off (and the autopilot's disarm where there is one)."""
        self.armed = False

    def estop(self) -> None:
        """Immediate motor stop at the link level (where the robot has one); the HAL latches it."""
        self.disarm()

    # ---- data ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def observe(self) -> RobotState: ...

    @abc.abstractmethod
    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Apply a normalized action; returns what the robot applied."""

    def policy_action(self, state: RobotState) -> np.ndarray:
        """With ``onboard_policy``: the action the robot's own policy computed for ``state`` (the serial
        firmware's)."""
        raise NotImplementedError

    def on_mode(self, mode: str) -> None:  # noqa: B027 - optional hook
        """The HAL's lifecycle mode changed (``hardware/safety.py: Mode`` values)."""

    def attach_bundle(self, bundle_dir) -> None:  # noqa: B027 - optional hook
        """The bundle about to fly (a driver that runs the policy on the robot builds its firmware from it)."""

    def reset_policy(self) -> None:  # noqa: B027 - optional hook
        """Reset an onboard policy's action history (a new flight)."""

    # ---- what hold / land / off mean for this robot (normalized actions) --------------------------
    def hold_action(self) -> np.ndarray:
        return np.asarray(self.layout.extras.get("hold_action", np.zeros(self.layout.action_size)), np.float32)

    def land_action(self) -> np.ndarray:
        return np.asarray(self.layout.extras.get("land_action", self.hold_action()), np.float32)

    def off_action(self) -> np.ndarray:
        return np.array([t.low for t in self.layout.action for _ in range(t.size)], np.float32)

    def position(self, state: RobotState) -> np.ndarray | None:
        """The position the geofence checks (the layout's ``position_term``), or None."""
        name = self.layout.extras.get("position_term")
        if name is None:
            return None
        start = 0
        for t in self.layout.robot_terms("policy"):
            if t.name == name:
                return state.values[start:start + t.size]
            start += t.size
        return None

    def status(self) -> dict:
        """Driver counters for the flight log (frames, errors, ...)."""
        return {}


def parse_uri(uri: str) -> tuple[str, str, dict[str, str]]:
    """``scheme://rest?k=v&...`` -> (scheme, rest, query)."""
    if "://" not in uri:
        raise UserError(f"robot URI {uri!r} has no scheme; known: " + ", ".join(f"{s}://" for s in ROBOTS.names()))
    parts = urlsplit(uri)
    rest = uri.split("://", 1)[1].split("?", 1)[0]
    return parts.scheme, rest, dict(parse_qsl(parts.query, keep_blank_values=True))


def make_robot(uri: str) -> Robot:
    import embodied.hardware.drivers  # noqa: F401  (registers the drivers)

    scheme, _, _ = parse_uri(uri)
    if scheme not in ROBOTS:
        raise UserError(f"unknown robot URI scheme {scheme!r}; known: " + ", ".join(f"{s}://" for s in ROBOTS.names()))
    return ROBOTS.get(scheme)(uri)


def vehicle_options(query: dict[str, str], uri: str, timeout: float) -> tuple[str, np.ndarray, float]:
    """The options of a flight-controller URI (MAVLink, Crazyflie): ``task`` whose layout it is flown with (default
    ``quadrotor-hover-rates``), ``origin=x,y,z`` (the set-point in the vehicle's frame [m]) and ``timeout`` [s] of
    the connection; any other parameter is a ``UserError``."""
    query = dict(query)
    task = query.pop("task", "quadrotor-hover-rates")
    try:
        origin = np.array([float(v) for v in query.pop("origin", "0,0,0").split(",")])
        timeout = float(query.pop("timeout", str(timeout)))
    except ValueError:
        raise UserError(f"{uri}: origin must be x,y,z and timeout a number") from None
    if origin.shape != (3,):
        raise UserError(f"{uri}: origin must be x,y,z")
    if query:
        raise UserError(f"unknown parameter(s) {', '.join(query)} in {uri}; known: task, origin, timeout")
    return task, origin, timeout


def task_layout(task: str) -> Layout:
    """A registered task's layout (its default config), what a vehicle driver flies with."""
    import embodied.tasks  # noqa: F401

    spec = TASKS.get(task)
    return spec.make(spec.config_cls(), num_envs=1, device="cpu", seed=0).layout()


def monotonic() -> float:
    return time.monotonic()
