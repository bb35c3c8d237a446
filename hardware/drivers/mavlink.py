"""``mavlink://udp:<host>:<port>?task=quadrotor-hover-rates``: a PX4-style vehicle over MAVLink 2 (pymavlink),
flown with collective thrust + body-rate set-points (SET_ATTITUDE_TARGET, attitude ignored) in OFFBOARD.

State comes from ATTITUDE and LOCAL_POSITION_NED, converted to the task's frames (``hardware/frames.py``);
``origin=x,y,z`` (our frame, m) is the set-point the policy hovers at. Arming follows PX4's rules: stream
set-points first (>= 2 Hz), then MAV_CMD_DO_SET_MODE to OFFBOARD, then arm. The e-stop is
MAV_CMD_DO_FLIGHTTERMINATION. ``task`` names the layout the vehicle is flown with (its action must be
thrust + body rates)."""

from __future__ import annotations

import time

import numpy as np

from embodied.core.errors import UserError
from embodied.core.registry import ROBOTS
from embodied.hardware.frames import T, ned_to_ours
from embodied.hardware.robot import Robot, RobotError, RobotState, monotonic, parse_uri, task_layout, vehicle_options

PX4_OFFBOARD = 6


class MavlinkRobot(Robot):
    scheme = "mavlink"

    def __init__(self, uri: str):
        super().__init__(uri)
        _, rest, query = parse_uri(uri)
        if not rest.startswith("udp:") or rest.count(":") != 2:
            raise UserError(f"{uri}: expected mavlink://udp:<host>:<port>")
        _, self.host, port = rest.split(":")
        if not port.isdigit():
            raise UserError(f"{uri}: the port must be a number")
        self.port = int(port)
        if not 1 <= self.port <= 65535:
            raise UserError(f"{uri}: port {self.port} is out of range (1-65535)")
        self.task, self.origin, self.connect_timeout = vehicle_options(query, uri, timeout=2.0)
        self.conn = None
        self.seq = 0
        self._att = self._pos = None
        self._last_beat = 0.0
        self.status_texts: list[str] = []
        self.acks: list[tuple[int, int]] = []
        self.sent = 0

    # ---- link ----------------------------------------------------------------------------------------
    def connect(self) -> None:
        from pymavlink import mavutil

        self.layout = task_layout(self.task)
        names = [t.name for t in self.layout.action]
        if names[0] != "collective_thrust":
            raise UserError(f"task {self.task!r} has action {names}; MAVLink set-points carry thrust + body rates "
                            "(use quadrotor-hover-rates)")
        self.m = mavutil.mavlink
        self.conn = mavutil.mavlink_connection(f"udpout:{self.host}:{self.port}", source_system=255,
                                               source_component=190)
        self._beat(force=True)
        deadline = time.monotonic() + self.connect_timeout
        while time.monotonic() < deadline:
            self._beat()
            msg = self.conn.recv_match(type="HEARTBEAT", blocking=True, timeout=0.1)
            if msg is not None and msg.get_srcSystem() != 255:
                self.target = (msg.get_srcSystem(), msg.get_srcComponent() or 1)
                while self._att is None or self._pos is None:  # the first state before anyone arms on it
                    if time.monotonic() > deadline:
                        break
                    self._beat()
                    self._drain()
                    time.sleep(0.005)
                else:
                    return
                break
        self.conn.close()
        raise UserError(f"no MAVLink vehicle answers at udp:{self.host}:{self.port} "
                        f"(no heartbeat and telemetry within {self.connect_timeout:g} s)")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_beat >= 0.5:
            self.conn.mav.heartbeat_send(self.m.MAV_TYPE_GCS, self.m.MAV_AUTOPILOT_INVALID, 0, 0, 0)
            self._last_beat = now

    def _drain(self, budget: int = 2000) -> None:
        """Parse every datagram waiting on the socket (up to ``budget``): one that holds no valid message
        (noise, a corrupt frame) must not leave the real telemetry queued behind it."""
        import select

        try:
            for _ in range(budget):
                msg = self.conn.recv_match(blocking=False)
                if msg is None:
                    if not select.select([self.conn.port], [], [], 0)[0]:
                        return
                    continue
                kind = msg.get_type()
                if hasattr(self, "target") and msg.get_srcSystem() != self.target[0]:
                    continue  # another system on the link
                if kind == "ATTITUDE":
                    self._att = msg
                    self.seq += 1
                elif kind == "LOCAL_POSITION_NED":
                    self._pos = msg
                elif kind == "STATUSTEXT":
                    self.status_texts.append(msg.text)
                elif kind == "COMMAND_ACK":
                    self.acks.append((msg.command, msg.result))
                elif kind == "HEARTBEAT":
                    self.vehicle_mode = (msg.base_mode, msg.custom_mode)
                    main_mode = (msg.custom_mode >> 16) & 0xFF
                    if self.armed and main_mode != PX4_OFFBOARD:  # its failsafe took over: our set-points are ignored
                        raise RobotError(f"the vehicle left OFFBOARD (main mode {main_mode}): "
                                         + "; ".join(self.status_texts[-2:]))
        except OSError as e:
            raise RobotError(f"MAVLink link failed: {e}") from None

    def _command(self, command: int, *params: float, wait: float = 1.0) -> bool:
        p = list(params) + [0.0] * (7 - len(params))
        self.acks.clear()
        self.conn.mav.command_long_send(*self.target, command, 0, *p)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._drain()
            for c, result in self.acks:
                if c == command:
                    return result == self.m.MAV_RESULT_ACCEPTED
            time.sleep(0.005)
        raise RobotError(f"MAVLink command {command} not acknowledged within {wait} s")

    # ---- robot verbs ---------------------------------------------------------------------------------
    def arm(self) -> None:
        hold = self.hold_action()
        for _ in range(12):  # PX4: a set-point stream (>= 2 Hz) before OFFBOARD is accepted
            self.send_action(hold)
            self._drain()
            time.sleep(0.05)
        if not self._command(self.m.MAV_CMD_DO_SET_MODE, self.m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED, PX4_OFFBOARD):
            raise RobotError("the vehicle refused OFFBOARD: " + "; ".join(self.status_texts[-2:]))
        if not self._command(self.m.MAV_CMD_COMPONENT_ARM_DISARM, 1.0):
            raise RobotError("the vehicle refused to arm: " + "; ".join(self.status_texts[-2:]))
        super().arm()

    def disarm(self) -> None:
        if self.conn is not None:
            try:
                self._command(self.m.MAV_CMD_COMPONENT_ARM_DISARM, 0.0, wait=0.5)
            except RobotError:
                pass  # the link is gone: nothing more to tell it
        super().disarm()

    def estop(self) -> None:
        if self.conn is not None:
            self._command(self.m.MAV_CMD_DO_FLIGHTTERMINATION, 1.0, wait=0.5)
        super().disarm()

    def observe(self) -> RobotState:
        self._beat()
        self._drain()
        if self._att is None or self._pos is None:
            return RobotState(np.full(self.layout.robot_size(), np.nan, np.float32), self.seq, monotonic())
        a, q = self._att, self._pos
        p, r, v, w = ned_to_ours((q.x, q.y, q.z), (q.vx, q.vy, q.vz), a.roll, a.pitch, a.yaw,
                                 (a.rollspeed, a.pitchspeed, a.yawspeed))
        values = np.concatenate([p - self.origin, r.reshape(-1), v, w]).astype(np.float32)
        return RobotState(values, self.seq, monotonic(), {"time_boot_ms": a.time_boot_ms})

    def send_action(self, action: np.ndarray) -> np.ndarray:
        a = np.clip(np.asarray(action, np.float32), -1.0, 1.0)
        terms = {t.name: t for t in self.layout.action}
        thrust = terms["collective_thrust"].offset + terms["collective_thrust"].scale * float(a[0])
        rates = np.asarray(self.layout.extras["max_rates"]) * a[1:4]  # FLU [rad/s]
        p, q, r = T @ rates  # FRD
        try:
            self.conn.mav.set_attitude_target_send(int(time.monotonic() * 1000) & 0xFFFFFFFF, *self.target, 128,
                                                   [1.0, 0.0, 0.0, 0.0], p, q, r, thrust)
        except OSError as e:
            raise RobotError(f"MAVLink send failed: {e}") from None
        self.sent += 1
        return a

    def status(self) -> dict:
        return {"setpoints_sent": self.sent, "attitude_received": self.seq, "status_texts": self.status_texts[-5:]}


ROBOTS.register("mavlink", MavlinkRobot)
