"""``crazyflie://udp://<host>:<port>`` (a software-in-the-loop vehicle, ``hardware/sitl/crazyflie.py``) and
``crazyflie://radio://0/80/2M/E7E7E7E7E7`` (hardware, through a Crazyradio): a Crazyflie through the unmodified
cflib client. State from three log blocks at 100 Hz (``stateEstimate.x/y/z/vx/vy/vz``, ``stateEstimate.q*``,
``gyro.*``; the Crazyflie's frames are ours, x forward, y left, z up); arming and the emergency stop through the
supervisor. ``timeout`` (s) bounds the connection attempt (cflib itself waits forever).

Two action levels, chosen by the bundle deployed:
- thrust + body rates (``quadrotor-hover-rates``): the HAL's policy, sent as cflib's MANUAL set-points with the
  rate flag;
- motor level (``quadrotor-hover``): the generated C runs onboard as the out-of-tree controller
  (``hardware/crazyflie_app.py``, flashed beforehand); the driver selects it (``stabilizer.controller = 6``),
  streams the hover target as a position set-point, and reads the motors back (``motor.m1-m4``, a fourth log
  block) as the applied action. The HAL's hold/land actions do not reach the motors in this mode: its safety
  layer acts by landing (the target stops streaming), disarming and the e-stop."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from embodied.core.errors import UserError
from embodied.core.registry import ROBOTS
from embodied.hardware.frames import quat_to_rotmat
from embodied.hardware.robot import Robot, RobotError, RobotState, monotonic, parse_uri, task_layout, vehicle_options

BLOCKS = (("pos_vel", [f"stateEstimate.{n}" for n in ("x", "y", "z", "vx", "vy", "vz")]),
          ("quat", [f"stateEstimate.{n}" for n in ("qw", "qx", "qy", "qz")]),
          ("gyro", [f"gyro.{n}" for n in ("x", "y", "z")]))


LAND_SPEED = 0.3  # [m/s] how fast an onboard-controlled landing lowers the hover target (at 100 Hz)


class CrazyflieRobot(Robot):
    scheme = "crazyflie"

    def __init__(self, uri: str):
        super().__init__(uri)
        _, link, query = parse_uri(uri)
        if link.split("://")[0] not in ("udp", "radio", "usb", "tcp"):
            raise UserError(f"{uri}: expected crazyflie://udp://HOST:PORT or crazyflie://radio://...")
        self.link = link
        self.task, self.origin, self.timeout = vehicle_options(query, uri, timeout=5.0)
        self.scf = None
        self.seq = 0
        self._latest: dict[str, tuple[int, list[float]]] = {}
        self._state: np.ndarray | None = None
        self._lock = threading.Lock()
        self.sent = 0
        self.onboard_policy = False
        self._motors = np.zeros(4)
        self._blocks = BLOCKS

    def attach_bundle(self, bundle_dir) -> None:
        from embodied.hardware.bundle import read_bundle

        layout = read_bundle(bundle_dir)["layout"]
        if [t.name for t in layout.action] == ["rpm_command"]:
            self.onboard_policy, self.bundle_layout = True, layout
            self._blocks = (*BLOCKS, ("motor", [f"motor.m{i}" for i in range(1, 5)]))

    def connect(self) -> None:
        import cflib.crtp
        from cflib.crazyflie import Crazyflie
        from cflib.crazyflie.log import LogConfig
        from cflib.crazyflie.syncCrazyflie import SyncCrazyflie

        self.layout = self.bundle_layout if self.onboard_policy else task_layout(self.task)
        if not self.onboard_policy and self.layout.action[0].name != "collective_thrust":
            raise UserError(f"task {self.task!r}: cflib set-points carry thrust + body rates "
                            "(use quadrotor-hover-rates; RPM-level policies fly as the onboard C controller)")
        # cflib logs a link that fails to open with the whole traceback (logging's last-resort handler prints it on
        # stderr); the UserError below says it in one line
        logging.getLogger("cflib").setLevel(logging.CRITICAL)
        cflib.crtp.init_drivers()
        self.cf = Crazyflie(rw_cache=None)
        self.scf = SyncCrazyflie(self.link, cf=self.cf)
        result: dict = {}

        def opener():
            try:
                self.scf.open_link()
                result["ok"] = True
            except Exception as e:  # cflib raises plain Exceptions for a failed link
                result["error"] = e

        t = threading.Thread(target=opener, daemon=True)
        t.start()
        t.join(self.timeout)
        if not result.get("ok"):
            self.cf.close_link()
            self.scf = None
            reason = str(result.get("error", f"no answer within {self.timeout:g} s")).strip().splitlines()
            raise UserError(f"cannot connect to the Crazyflie at {self.link}: {reason[0] if reason else 'no reason'}")
        try:
            self._setup(LogConfig)
        except BaseException:
            self.close()
            raise

    def _setup(self, LogConfig) -> None:  # noqa: N803 - the cflib class
        self.configs = []
        for name, variables in self._blocks:
            lc = LogConfig(name=name, period_in_ms=10)
            for v in variables:
                lc.add_variable(v, "uint16_t" if v.startswith("motor.") else "float")
            lc.data_received_cb.add_callback(self._on_log)
            self.cf.log.add_config(lc)
            lc.start()
            self.configs.append(lc)
        self.cf.connection_lost.add_callback(lambda *_: setattr(self, "_lost", True))
        confirmed = threading.Event()
        if self.onboard_policy:  # the out-of-tree controller (the policy): flying starts only once the firmware
            # echoed the write (a busy link delivers it late; the stock controller must not fly the policy's targets)
            self.cf.param.add_update_callback(group="stabilizer", name="controller",
                                              cb=lambda _name, value: confirmed.set() if str(value) == "6" else None)
            self.cf.param.set_value("stabilizer.controller", "6")
        else:
            confirmed.set()
        deadline = time.monotonic() + self.timeout
        while self._state is None or not confirmed.is_set():  # the first full sample before anyone arms on it
            if time.monotonic() > deadline:
                self.close()
                what = "sends no state (log blocks)" if self._state is None else \
                    "did not confirm the out-of-tree controller (stabilizer.controller = 6; is the app flashed?)"
                raise UserError(f"the Crazyflie at {self.link} {what} within {self.timeout:g} s")
            time.sleep(0.01)

    _lost = False

    def _on_log(self, timestamp: int, data: dict, config) -> None:
        with self._lock:
            self._latest[config.name] = (timestamp, [data[v] for v in dict(self._blocks)[config.name]])
            # the firmware runs each block on its own timer: the state is the newest sample of every block, taken
            # once all blocks are within one period of each other (updated as each block arrives)
            if len(self._latest) < len(self._blocks):
                return
            stamps = [s for s, _ in self._latest.values()]
            if max(stamps) - min(stamps) <= 10:
                (_, pv), (_, q), (_, g) = (self._latest[n] for n, _ in BLOCKS)
                if self.onboard_policy:
                    self._motors = np.asarray(self._latest["motor"][1], float) / 65535.0
                r = quat_to_rotmat(q)
                self._state = np.concatenate([np.array(pv[:3]) - self.origin, r.reshape(-1), pv[3:],
                                              np.radians(g)]).astype(np.float32)
                self.seq += 1

    def close(self) -> None:
        if self.scf is not None:
            for lc in getattr(self, "configs", []):
                try:
                    lc.stop()
                except Exception:  # the link may already be gone
                    pass
            self.scf.close_link()
            self.scf = None

    def _check(self) -> None:
        if self._lost:
            raise RobotError(f"the link to the Crazyflie at {self.link} was lost")

    def arm(self) -> None:
        self.cf.commander.send_setpoint(0, 0, 0, 0)  # the firmware unlocks thrust after a zero set-point
        self.cf.supervisor.send_arming_request(True)
        super().arm()

    def disarm(self) -> None:
        if self.scf is not None:
            self.cf.commander.send_stop_setpoint()
            self.cf.supervisor.send_arming_request(False)
        super().disarm()

    def estop(self) -> None:
        if self.scf is not None:
            self.cf.supervisor.send_emergency_stop()
        super().disarm()

    def observe(self) -> RobotState:
        self._check()
        with self._lock:
            values = self._state if self._state is not None else np.full(self.layout.robot_size(), np.nan)
            return RobotState(np.asarray(values, np.float32), self.seq, monotonic())

    def policy_action(self, state: RobotState) -> np.ndarray:
        """The onboard controller's motor command, read back: normalized speed = sqrt(normalized force)."""
        with self._lock:
            return (2.0 * np.sqrt(np.clip(self._motors, 0.0, 1.0)) - 1.0).astype(np.float32)

    _mode = "active"
    _land_z = 0.0

    def on_mode(self, mode: str) -> None:
        if mode == "landing" and self._mode != "landing":
            self._land_z = float(self.origin[2])
        self._mode = mode

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self._check()
        a = np.clip(np.asarray(action, np.float32), -1.0, 1.0)
        if self.onboard_policy:  # the controller onboard flies; the HAL moves its target (descending to land)
            x, y, z = map(float, self.origin)
            if self._mode == "landing":
                self._land_z -= LAND_SPEED / 100.0
                z = self._land_z
            self.cf.commander.send_position_setpoint(x, y, z, 0.0)
            self.sent += 1
            return self.policy_action(None)
        t = self.layout.action[0]
        thrust = t.offset + t.scale * float(a[0])  # fraction of the maximum
        rates = np.degrees(np.asarray(self.layout.extras["max_rates"]) * a[1:4])
        self.cf.commander.send_setpoint_manual(float(rates[0]), float(rates[1]), float(rates[2]),
                                               100.0 * thrust, True)
        self.sent += 1
        return a

    def status(self) -> dict:
        return {"setpoints_sent": self.sent, "states_received": self.seq}


ROBOTS.register("crazyflie", CrazyflieRobot)
