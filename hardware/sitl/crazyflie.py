"""A software-in-the-loop Crazyflie: our simulator (``quadrotor-hover-rates`` by default) behind CRTP over UDP,
complete enough that the unmodified ``cflib.crazyflie.Crazyflie`` connects through its ``udp://`` link.

It answers what cflib's connect asks, in order (platform "source" string and protocol version 12, log reset,
log and parameter tables of contents (V2, with CRCs), memory count 0, every parameter read), then: parameter
writes (echoed), log blocks (create/append/start/stop/delete/reset; data every period with a 24-bit ms
timestamp), set-points (generic MANUAL, type 11, with the rate flag: thrust + roll/pitch/yaw rates; the legacy
RPYT packet with ``flightmode.stabModeRoll/Pitch`` = 0 (rate mode)), the supervisor (arm, emergency stop),
``notify_setpoint_stop``, and the latency ping. Like the firmware it levels (hover thrust, zero rates) when
set-points are older than 0.5 s and stops the motors after 2 s.

Logged variables (all float32, ours = the firmware's frames, x forward, y left, z up): ``stateEstimate.x/y/z``
[m], ``stateEstimate.vx/vy/vz`` [m/s], ``stateEstimate.qw/qx/qy/qz``, ``gyro.x/y/z`` [deg/s].
Run one: ``python -m embodied.hardware.sitl.crazyflie --port 19850``."""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import torch

from embodied.hardware.drivers.sim import VEHICLE_EPISODE_S
from embodied.hardware.sitl import parse_factors, serve

LOG_VARS = [("stateEstimate", n, 7) for n in ("x", "y", "z", "vx", "vy", "vz", "qw", "qx", "qy", "qz")] + \
    [("gyro", n, 7) for n in ("x", "y", "z")] + [("motor", f"m{i}", 2) for i in range(1, 5)]  # 7 float, 2 uint16
# (group, name, type byte, initial value): u8 = 0x08
PARAMS = [("stabilizer", "controller", 0x08, 1), ("flightmode", "stabModeRoll", 0x08, 1),
          ("flightmode", "stabModePitch", 0x08, 1), ("commander", "enHighLevel", 0x08, 0)]
SOURCE = b"Bitcraze Crazyflie"
PROTOCOL_VERSION = 12
THRUST_LO, THRUST_SPAN = 10001, 49999  # cflib's MANUAL set-point: thrust_u16 = 10001 + pct/100 * 49999


def header(port: int, channel: int) -> int:
    return (port << 4) | 0x0C | channel


class CrazyflieVehicle:
    def __init__(self, port: int = 0, host: str = "127.0.0.1", task: str = "quadrotor-hover-rates",
                 factors: dict | None = None, seed: int = 0, onboard: Path | None = None):
        from embodied.hardware.drivers.sim import sim_env

        self.oot = OnboardController(onboard) if onboard is not None else None
        if self.oot is not None:
            task = "quadrotor-hover"  # the controller drives the motors: the RPM-level plant
        self.env = sim_env(task, factors or {}, seed, episode_s=VEHICLE_EPISODE_S)
        self.forces = [0.0] * 4
        self.position_setpoint: tuple[float, float, float] | None = None
        self.tick = 0
        self.env.reset(seed=seed)
        self.layout = self.env.layout()
        self.dt = 1.0 / self.layout.control_hz
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(0.001)
        self.port = self.sock.getsockname()[1]
        self.client = None
        self.params = {i: v for i, (_, _, _, v) in enumerate(PARAMS)}
        self.blocks: dict[int, dict] = {}  # id -> {"vars": [ids], "period": s, "next": t, "on": bool}
        self.armed = self.estopped = False
        self.setpoint = np.array(self.layout.extras["hold_action"], np.float32)
        self.setpoint_t = -1.0
        self.counts: dict[str, int] = {}
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="crazyflie-vehicle")
        self.log_crc = zlib.crc32(repr(("log", LOG_VARS)).encode())
        self.param_crc = zlib.crc32(repr(("param", PARAMS)).encode())

    def __enter__(self) -> CrazyflieVehicle:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _send(self, port: int, channel: int, payload: bytes) -> None:
        if self.client is not None:
            self.sock.sendto(bytes([header(port, channel)]) + payload, self.client)

    # ---- CRTP --------------------------------------------------------------------------------------
    def _handle(self, data: bytes, now: float) -> None:
        if not data:
            return
        h, p = data[0], data[1:]
        port, ch = h >> 4, h & 3
        if port == 15:  # link control
            if ch == 1 and p[:1] == b"\x00":
                self._send(15, 1, SOURCE)
            elif ch == 0 and p[:1] == b"\x00":
                self._send(15, 0, p)  # latency ping: echo
            elif h == 0xFF:
                self._send(15, 3, b"")
        elif port == 13 and ch == 1 and p[:1] == b"\x00":  # platform: protocol version
            self._send(13, 1, bytes([0, PROTOCOL_VERSION]))
        elif port == 4 and ch == 0 and p[:1] == b"\x01":  # memory: none
            self._send(4, 0, b"\x01\x00")
        elif port in (5, 2) and ch == 0:
            self._toc(port, p)
        elif port == 5 and ch == 1:
            self._log_command(p, now)
        elif port == 2 and ch == 1 and len(p) >= 2:  # parameter read
            i = struct.unpack_from("<H", p)[0]
            if i in self.params:
                self._send(2, 1, p[:2] + b"\x00" + bytes([self.params[i] & 0xFF]))
        elif port == 2 and ch == 2 and len(p) >= 3:  # parameter write: echo
            i = struct.unpack_from("<H", p)[0]
            if i in self.params:
                self.params[i] = p[2]
                self._count("param_writes")
                self._send(2, 2, p[:3])
        elif port == 3 and ch == 0 and len(p) == 14:  # legacy RPYT
            roll, neg_pitch, yawrate, thrust = struct.unpack("<fffH", p)
            rate_mode = self.params[1] == 0 and self.params[2] == 0
            if rate_mode:
                self._setpoint(roll, -neg_pitch, yawrate, thrust / 65535.0, now)
            self._count("rpyt")
        elif port == 7 and ch == 0 and p[:1] == b"\x0b" and len(p) == 16:  # generic MANUAL
            _, roll, neg_pitch, yawrate, thrust, rate = struct.unpack("<BfffHB", p)
            if rate:
                self._setpoint(roll, -neg_pitch, yawrate, (thrust - THRUST_LO) / THRUST_SPAN, now)
            self._count("manual")
        elif port == 7 and ch == 0 and p[:1] == b"\x07" and len(p) == 17:  # generic POSITION: x, y, z, yaw
            self.position_setpoint = struct.unpack_from("<fff", p, 1)
            self.setpoint_t = now
            self._count("position")
        elif port == 7 and ch == 0 and p[:1] == b"\x00":  # generic STOP
            self.setpoint_t = -1.0
            self.position_setpoint = None
        elif port == 7 and ch == 1:  # meta: notify set-point stop
            self.setpoint_t = now - 0.5  # level at once, as the firmware does
        elif port == 9 and ch == 1 and p:  # supervisor
            if p[0] == 1 and len(p) >= 2:
                self.armed = bool(p[1]) and not self.estopped
                self._send(9, 1, bytes([0x81, 1, int(self.armed)]))
            elif p[0] == 3:
                self.estopped, self.armed = True, False
                self._count("estop")

    def _setpoint(self, roll_dps: float, pitch_dps: float, yaw_dps: float, thrust: float, now: float) -> None:
        rates = np.radians([roll_dps, pitch_dps, yaw_dps]) / np.asarray(self.layout.extras["max_rates"])
        a = np.concatenate([[2.0 * min(max(thrust, 0.0), 1.0) - 1.0], rates])
        self.setpoint = np.clip(a, -1.0, 1.0).astype(np.float32)
        self.setpoint_t = now

    def _toc(self, port: int, p: bytes) -> None:
        items = LOG_VARS if port == 5 else [(g, n, t) for g, n, t, _ in PARAMS]
        crc = self.log_crc if port == 5 else self.param_crc
        if p[:1] == b"\x03":  # TOC_INFO_V2
            self._send(port, 0, struct.pack("<BHI", 3, len(items), crc))
        elif p[:1] == b"\x02" and len(p) >= 3:  # TOC_ITEM_V2
            i = struct.unpack_from("<H", p, 1)[0]
            if i < len(items):
                g, n, t = items[i]
                self._send(port, 0, struct.pack("<BHB", 2, i, t) + g.encode() + b"\0" + n.encode() + b"\0")

    def _log_command(self, p: bytes, now: float) -> None:
        cmd = p[0] if p else -1
        if cmd == 5:  # reset
            self.blocks.clear()
            self._send(5, 1, b"\x05\x00\x00")
        elif cmd in (6, 7) and len(p) >= 2:  # create / append (V2): (type, id u16) triples
            bid = p[1]
            ids = [struct.unpack_from("<BH", p, 2 + 3 * k)[1] for k in range((len(p) - 2) // 3)]
            if any(i >= len(LOG_VARS) for i in ids):
                self._send(5, 1, bytes([cmd, bid, 2]))  # ENOENT: no such variable
                return
            if cmd == 6:
                self.blocks[bid] = {"vars": ids, "period": 0.01, "next": now, "on": False}
            elif bid in self.blocks:
                self.blocks[bid]["vars"] += ids
            self._send(5, 1, bytes([cmd, bid, 0]))
        elif cmd == 3 and len(p) >= 3 and p[1] in self.blocks:  # start
            self.blocks[p[1]].update(period=p[2] * 0.01, next=now, on=True)
            self._send(5, 1, bytes([3, p[1], 0]))
        elif cmd in (4, 2) and len(p) >= 2:  # stop / delete
            b = self.blocks.get(p[1])
            if b is not None:
                b["on"] = False
                if cmd == 2:
                    del self.blocks[p[1]]
            self._send(5, 1, bytes([cmd, p[1], 0]))

    def _values(self) -> list[float]:
        s = self.env.sim
        q = s.quat_wb[0].tolist()  # w, x, y, z
        motors = [min(65535, max(0, round(f * 65535))) for f in self.forces]
        return [*s.pos_w[0].tolist(), *s.lin_vel_w[0].tolist(), *q, *np.degrees(s.ang_vel_b[0].numpy()).tolist(),
                *motors]

    def _action(self, now: float) -> np.ndarray:
        age = now - self.setpoint_t
        if not self.armed or self.setpoint_t < 0 or age > 2.0:
            return np.array([-1.0, 0.0, 0.0, 0.0], np.float32)  # motors off
        if age > 0.5:  # the commander watchdog levels the aircraft
            return np.array(self.layout.extras["hold_action"], np.float32)
        return self.setpoint

    def _onboard(self, now: float) -> np.ndarray:
        """One 100 Hz step of the out-of-tree controller (the stabilizer loop's tick counts at 1 kHz)."""
        sim = self.env.sim
        live = self.position_setpoint is not None and now - self.setpoint_t <= 2.0
        self.forces = self.oot.step(sim.pos_w[0].tolist(), sim.quat_wb[0].tolist(), sim.lin_vel_w[0].tolist(),
                                    np.degrees(sim.ang_vel_b[0].numpy()).tolist(),
                                    self.position_setpoint if live else None, self.tick * 10)
        return (2.0 * np.sqrt(np.clip(self.forces, 0.0, 1.0)) - 1.0).astype(np.float32)

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            while True:
                try:
                    data, addr = self.sock.recvfrom(64)
                except (TimeoutError, BlockingIOError):
                    break
                except OSError:
                    return
                self.client = addr
                with self.lock:
                    self._handle(data, time.monotonic())
            now = time.monotonic()
            if now >= next_tick:
                with self.lock:
                    if self.armed:
                        if self.oot is not None and self.params[0] == 6:  # stabilizer.controller: out-of-tree
                            a = self._onboard(now)
                        else:
                            a = self._action(now)
                        _, _, term, _, _ = self.env.step(torch.from_numpy(a)[None])
                        self._count("steps")
                        if term[0]:  # the plant restarts from a new initial state
                            self._count("crashes")
                        self.tick += 1
                    values = self._values()
                    ms = int((now - self.t0) * 1000) & 0xFFFFFF
                    for bid, b in self.blocks.items():
                        if b["on"] and now >= b["next"]:
                            b["next"] += b["period"]
                            fmt = "".join("f" if LOG_VARS[i][2] == 7 else "H" for i in b["vars"])
                            payload = struct.pack("<B", bid) + ms.to_bytes(3, "little") + struct.pack(
                                f"<{fmt}", *(values[i] if LOG_VARS[i][2] == 7 else int(values[i]) for i in b["vars"]))
                            self._send(5, 2, payload)
                next_tick += self.dt
                if next_tick < now:
                    next_tick = now + self.dt


class OnboardController:
    """The bundle's out-of-tree controller (``hardware/crazyflie_app.py``), built for this host against the stub
    firmware headers and called through ctypes with the firmware's structs."""

    def __init__(self, bundle_dir: Path):
        import ctypes as C
        import tempfile

        from embodied.hardware.crazyflie_app import build_host_controller, write_oot_app

        self._tmp = tempfile.TemporaryDirectory(prefix="embodied_oot_")
        app = write_oot_app(Path(bundle_dir), Path(self._tmp.name) / "app")
        self.lib = C.CDLL(str(build_host_controller(app, Path(self._tmp.name) / "build" / "liboot.so")))
        f, u32 = C.c_float, C.c_uint32

        class Vec3(C.Structure):
            _fields_ = [("timestamp", u32), ("x", f), ("y", f), ("z", f)]

        class Att(C.Structure):
            _fields_ = [("timestamp", u32), ("roll", f), ("pitch", f), ("yaw", f)]

        class Quat(C.Structure):
            _fields_ = [("x", f), ("y", f), ("z", f), ("w", f)]

        class Axis(C.Structure):
            _fields_ = [("x", f), ("y", f), ("z", f)]

        class Sensors(C.Structure):
            _fields_ = [("acc", Axis), ("gyro", Axis), ("mag", Axis), ("baro", f * 3),
                        ("interruptTimestamp", C.c_uint64)]

        class State(C.Structure):
            _fields_ = [("attitude", Att), ("attitudeQuaternion", Quat), ("position", Vec3), ("velocity", Vec3),
                        ("acc", Vec3)]

        class Modes(C.Structure):
            _fields_ = [(n, C.c_int) for n in ("x", "y", "z", "roll", "pitch", "yaw", "quat")]

        class Setpoint(C.Structure):
            _fields_ = [("timestamp", u32), ("attitude", Att), ("attitudeRate", Att), ("attitudeQuaternion", Quat),
                        ("thrust", f), ("position", Vec3), ("velocity", Vec3), ("acceleration", Vec3), ("jerk", Vec3),
                        ("velocity_body", C.c_bool), ("mode", Modes)]

        class Control(C.Structure):
            _fields_ = [("normalizedForces", f * 4), ("controlMode", C.c_int)]

        self.state, self.sensors, self.setpoint, self.control = State(), Sensors(), Setpoint(), Control()
        self.lib.controllerOutOfTree.argtypes = [C.POINTER(Control), C.POINTER(Setpoint), C.POINTER(Sensors),
                                                 C.POINTER(State), u32]
        self.lib.controllerOutOfTreeInit()

    def step(self, pos, quat_wxyz, vel, gyro_dps, target, tick: int) -> list[float]:
        s, se = self.state, self.setpoint
        s.position.x, s.position.y, s.position.z = pos
        q = s.attitudeQuaternion
        q.w, q.x, q.y, q.z = quat_wxyz
        s.velocity.x, s.velocity.y, s.velocity.z = vel
        g = self.sensors.gyro
        g.x, g.y, g.z = gyro_dps
        if target is None:
            se.mode.z = 0  # modeDisable
        else:
            se.mode.x = se.mode.y = se.mode.z = 1  # modeAbs
            se.position.x, se.position.y, se.position.z = target
        self.lib.controllerOutOfTree(self.control, self.setpoint, self.sensors, self.state, tick)
        return list(self.control.normalizedForces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=19850)
    ap.add_argument("--task", default="quadrotor-hover-rates")
    ap.add_argument("--plant", default="", help="factors, e.g. mass=1.2,thrust=0.9")
    args = ap.parse_args()
    serve(CrazyflieVehicle(args.port, task=args.task, factors=parse_factors(args.plant)),
          f"Crazyflie (CRTP) on udp://127.0.0.1:{args.port} ({args.task})")

if __name__ == "__main__":
    main()
