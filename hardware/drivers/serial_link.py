"""``serial://<device>?baud=921600&plant=<task>&mass=1.2...``: the policy runs on the far side of a serial
line, in the firmware generated beside it (``firmware.c`` + ``policy.c``), and the HAL exchanges framed
STATE / ACTION messages with it (``hardware/protocol.py``) through pyserial.

The state the firmware is sent comes from ``plant``: a simulated robot (the ``sim://`` driver, same plant
parameters) whose motors receive the action the firmware computed, after the HAL's safety layer. That is
hardware-in-the-loop: the C policy flies our simulator over a real tty. ``serial://hil?...`` starts the
bundle's firmware on a pseudo-terminal pair itself (``hardware/hil.py``); any other device is opened as is.
Other parameters: ``timeout`` (s, one reply; default 0.05), ``seed``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from embodied.core.errors import UserError
from embodied.core.registry import ROBOTS
from embodied.hardware import protocol as P
from embodied.hardware.drivers.sim import SimRobot
from embodied.hardware.robot import Robot, RobotError, RobotState, parse_uri


class SerialRobot(Robot):
    scheme = "serial"
    onboard_policy = True

    def __init__(self, uri: str):
        super().__init__(uri)
        _, device, query = parse_uri(uri)
        self.device = device
        try:
            self.baud = int(query.pop("baud", "921600"))
            self.timeout = float(query.pop("timeout", "0.05"))
        except ValueError:
            raise UserError(f"{uri}: baud must be an integer and timeout a number") from None
        plant = query.pop("plant", None)
        if not plant:
            raise UserError(f"{uri}: name the plant the firmware flies, e.g. serial://hil?plant=quadrotor-hover "
                            "(the state source of a physical vehicle is not part of this driver)")
        self.firmware_exe: Path | None = Path(query.pop("firmware")) if "firmware" in query else None
        rest = "&".join(f"{k}={v}" for k, v in query.items())
        self.plant = SimRobot(f"sim://{plant}" + (f"?{rest}" if rest else ""))
        self.port = None
        self._fw = None
        self.seq = 0
        self.decoder = P.Decoder()
        self.timeouts = 0
        self.round_trip_s: list[float] = []
        self._pending: list[P.Frame] = []

    def attach_bundle(self, bundle_dir: Path) -> None:
        """What ``serial://hil`` starts when no ``firmware=`` is given: the bundle's own firmware."""
        if self.firmware_exe is None and self.device == "hil":
            from embodied.hardware.hil import firmware_for

            self.firmware_exe = firmware_for(bundle_dir)

    # ---- link ----------------------------------------------------------------------------------------
    def connect(self) -> None:
        self.plant.connect()  # a bad plant is the user's input: found before any process or port is opened
        self.layout = self.plant.layout
        try:
            self._open_link()
        except BaseException:
            self.close()
            raise

    def _open_link(self) -> None:
        import serial

        path = self.device
        if self.device == "hil":
            from embodied.hardware.hil import FirmwareProcess

            if self.firmware_exe is None:
                raise UserError("serial://hil needs firmware=<executable> (embodied deploy passes the bundle's)")
            self._fw = FirmwareProcess(self.firmware_exe)
            path = self._fw.__enter__()
        try:
            self.port = serial.Serial(path, baudrate=self.baud, timeout=self.timeout, write_timeout=1.0)
        except (serial.SerialException, OSError, ValueError) as e:
            raise UserError(f"cannot open {path}: {e}") from None
        # zeros first: a frame the far side holds half of (a host killed mid-frame) completes and fails its CRC
        self.port.write(bytes(P.OVERHEAD + P.MAX_PAYLOAD))
        beat = self._request(P.HEARTBEAT, b"", P.HEARTBEAT, wait=1.0)
        if beat is None:
            raise UserError(f"no firmware answers on {path} (no heartbeat within 1 s)")
        want = (self.layout.robot_size("policy"), self.layout.action_size)
        if len(beat.payload) >= 11 and tuple(beat.payload[9:11]) != want:
            raise UserError(f"the firmware on {path} was built for state/action sizes {tuple(beat.payload[9:11])}, "
                            f"the plant's layout has {want}: flash the firmware of this bundle")

    def close(self) -> None:
        if self.port is not None:
            self.port.close()
            self.port = None
        self.plant.close()
        self._stop_firmware()

    def _stop_firmware(self) -> None:
        if self._fw is not None:
            self._fw.__exit__(None, None, None)
            self._fw = None

    def _send(self, msg: int, payload: bytes = b"") -> None:
        try:
            self.port.write(P.encode(msg, self.seq, payload))
        except Exception as e:  # serial.SerialException, OSError: the link is gone
            raise RobotError(f"serial write failed: {e}") from None
        self.seq = (self.seq + 1) & 0xFF

    def _receive(self, msg: int, wait: float, seq: int) -> P.Frame | None:
        """The reply ``msg`` to request ``seq``; late replies to earlier requests are discarded."""
        deadline = time.monotonic() + wait
        while True:
            for frame in self._pending:
                if frame.msg == msg and frame.seq == seq:
                    self._pending.remove(frame)
                    return frame
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self.port.timeout = left
                data = self.port.read(max(1, self.port.in_waiting))
            except Exception as e:
                raise RobotError(f"serial read failed: {e}") from None
            if not data and self._fw is not None and not self._fw.alive():
                raise RobotError("the firmware process exited")
            self._pending += self.decoder.feed(data)
            del self._pending[:-8]  # stale replies never pile up

    def _request(self, msg: int, payload: bytes, reply: int, wait: float) -> P.Frame | None:
        self._pending = []
        seq = self.seq
        self._send(msg, payload)
        return self._receive(reply, wait, seq)

    # ---- robot verbs ---------------------------------------------------------------------------------
    def arm(self) -> None:
        self._request(P.CLEAR_ESTOP, b"", P.ACK, self.timeout)
        self.plant.arm()
        super().arm()

    def disarm(self) -> None:
        self.plant.disarm()
        super().disarm()

    def estop(self) -> None:
        if self.port is not None:
            self._request(P.ESTOP, b"", P.ACK, self.timeout)
        self.disarm()

    def reset_policy(self) -> None:
        if self._request(P.RESET, b"", P.ACK, max(self.timeout, 0.2)) is None:
            raise RobotError("the firmware did not acknowledge RESET")

    def observe(self) -> RobotState:
        return self.plant.observe()  # a new episode: the loop calls reset_policy (RESET to the firmware)

    def policy_action(self, state: RobotState) -> np.ndarray | None:
        t0 = time.perf_counter()
        frame = self._request(P.STATE, P.floats(state.values), P.ACTION, self.timeout)
        if frame is None:
            self.timeouts += 1
            return None  # a missing command: the watchdog holds
        self.round_trip_s.append(time.perf_counter() - t0)
        if len(frame.payload) != 4 * self.layout.action_size:
            raise RobotError(f"the firmware sent an action of {len(frame.payload)} bytes, the layout's action has "
                             f"{self.layout.action_size} floats (firmware from another bundle?)")
        return np.asarray(P.unpack_floats(frame.payload), np.float32)

    def send_action(self, action: np.ndarray) -> np.ndarray:
        return self.plant.send_action(action)

    def status(self) -> dict:
        rt = self.round_trip_s
        return {**self.plant.status(), "frames": self.decoder.frames, "crc_errors": self.decoder.crc_errors,
                "timeouts": self.timeouts, "round_trip_us_mean": float(np.mean(rt) * 1e6) if rt else None,
                "round_trip_us_p99": float(np.percentile(rt, 99) * 1e6) if rt else None}


ROBOTS.register("serial", SerialRobot)
