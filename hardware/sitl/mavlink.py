"""A software-in-the-loop MAVLink vehicle: our simulator (``quadrotor-hover-rates`` by default, any plant
factors) behind a real MAVLink 2 endpoint (pymavlink), enforcing PX4's offboard rules:

- OFFBOARD (PX4 main mode 6, via MAV_CMD_DO_SET_MODE) is accepted only while set-points stream at >= 2 Hz
  (at least 2 SET_ATTITUDE_TARGET in the last second, the newest younger than 0.5 s); otherwise DENIED;
- arming (MAV_CMD_COMPONENT_ARM_DISARM) is accepted in OFFBOARD only;
- in OFFBOARD, a set-point stream that stops for ``offboard_loss_s`` (PX4 ``COM_OF_LOSS_T``) is a failsafe:
  the vehicle leaves OFFBOARD for hold (AUTO.LOITER, hover thrust, zero rates) and says so in STATUSTEXT;
- MAV_CMD_DO_FLIGHTTERMINATION cuts the motors and disarms.

It listens on ``udpin:<host>:<port>``, steps the plant in real time at the task's control rate with the latest
set-point held, and sends HEARTBEAT (2 Hz), ATTITUDE and LOCAL_POSITION_NED (every step).
Run one: ``python -m embodied.hardware.sitl.mavlink --port 14540 [--plant mass=1.2,thrust=0.9]``."""

from __future__ import annotations

import argparse
import collections
import threading
import time

import numpy as np
import torch

from embodied.hardware.drivers.sim import VEHICLE_EPISODE_S
from embodied.hardware.frames import T, ours_to_ned, quat_to_rotmat
from embodied.hardware.sitl import parse_factors, serve

PX4_OFFBOARD, PX4_AUTO, PX4_LOITER = 6, 4, 3


class MavlinkVehicle:
    def __init__(self, port: int, host: str = "127.0.0.1", task: str = "quadrotor-hover-rates",
                 factors: dict | None = None, seed: int = 0, offboard_loss_s: float = 0.5):
        from pymavlink import mavutil

        from embodied.hardware.drivers.sim import sim_env

        self.env = sim_env(task, factors or {}, seed, episode_s=VEHICLE_EPISODE_S)
        self.layout = self.env.layout()
        self.dt = 1.0 / self.layout.control_hz
        self.conn = mavutil.mavlink_connection(f"udpin:{host}:{port}", source_system=1, source_component=1)
        self.m = mavutil.mavlink
        self.offboard_loss_s = offboard_loss_s
        self.setpoint_times: collections.deque = collections.deque(maxlen=64)
        self.setpoint = np.array(self.layout.extras["hold_action"], np.float32)
        self.armed = self.terminated = False
        self.main_mode = PX4_AUTO
        self.sub_mode = PX4_LOITER
        self.events: list[str] = []
        self.counts = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="mavlink-vehicle")
        self.env.reset(seed=seed)
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> MavlinkVehicle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.conn.close()
        if self.error is not None:  # the vehicle's thread died: say why (a frozen count alone says nothing)
            raise RuntimeError(f"the MAVLink vehicle's thread stopped on {self.error!r}") from self.error

    def __enter__(self) -> MavlinkVehicle:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- protocol ----------------------------------------------------------------------------------
    def _ms(self) -> int:
        return int((time.monotonic() - self.t0) * 1000) & 0xFFFFFFFF

    def _say(self, text: str) -> None:
        self.events.append(text)
        self.conn.mav.statustext_send(self.m.MAV_SEVERITY_WARNING, text.encode()[:50])

    def _streaming(self, now: float) -> bool:
        recent = [t for t in self.setpoint_times if now - t <= 1.0]
        return len(recent) >= 2 and now - recent[-1] < 0.5

    def _ack(self, command: int, ok: bool) -> None:
        self.conn.mav.command_ack_send(command, self.m.MAV_RESULT_ACCEPTED if ok else self.m.MAV_RESULT_DENIED)
        self.counts["acks_ok" if ok else "acks_denied"] += 1

    def _handle(self, msg, now: float) -> None:
        try:
            self._dispatch(msg, now)
        except (ValueError, OverflowError, TypeError, AttributeError):  # a malformed field (NaN mode, ...): dropped
            self.counts["malformed"] += 1

    def _dispatch(self, msg, now: float) -> None:
        kind = msg.get_type()
        self.counts[kind] += 1
        if kind == "SET_ATTITUDE_TARGET":
            if not msg.type_mask & 128:  # attitude set-points are not what this vehicle takes
                return
            rates_flu = T @ np.array([msg.body_roll_rate, msg.body_pitch_rate, msg.body_yaw_rate])
            scale = self.layout.extras["max_rates"]
            a = np.concatenate([[2.0 * msg.thrust - 1.0], rates_flu / np.asarray(scale)])
            self.setpoint = np.clip(a, -1.0, 1.0).astype(np.float32)
            self.setpoint_times.append(now)
        elif kind == "COMMAND_LONG":
            c = msg.command
            if c == self.m.MAV_CMD_DO_SET_MODE:
                mode = int(msg.param2)
                if mode == PX4_OFFBOARD:
                    ok = self._streaming(now)
                    if ok:
                        self.main_mode = PX4_OFFBOARD
                    else:
                        self._say("offboard rejected: no setpoint stream")
                    self._ack(c, ok)
                else:
                    self.main_mode, self.sub_mode = mode, int(msg.param3)
                    self._ack(c, True)
            elif c == self.m.MAV_CMD_COMPONENT_ARM_DISARM:
                want = msg.param1 > 0.5
                ok = (not want) or (self.main_mode == PX4_OFFBOARD and not self.terminated)
                if ok:
                    self.armed = want
                else:
                    self._say("arming denied: not in offboard")
                self._ack(c, ok)
            elif c == self.m.MAV_CMD_DO_FLIGHTTERMINATION:
                if msg.param1 > 0.5:
                    self.terminated, self.armed = True, False
                    self._say("flight termination")
                self._ack(c, True)
            else:
                self._ack(c, False)

    def _action(self, now: float) -> np.ndarray:
        if not self.armed:
            return np.array([-1.0, 0.0, 0.0, 0.0], np.float32)  # zero thrust
        if self.main_mode == PX4_OFFBOARD and self.setpoint_times and now - self.setpoint_times[-1] > \
                self.offboard_loss_s:
            self.main_mode, self.sub_mode = PX4_AUTO, PX4_LOITER
            self.counts["failsafe"] += 1
            self._say("offboard lost: hold")
        if self.main_mode == PX4_OFFBOARD:
            return self.setpoint
        return np.array(self.layout.extras["hold_action"], np.float32)

    def _telemetry(self) -> None:
        sim, ms = self.env.sim, self._ms()
        p, r, v, w = (sim.pos_w[0].double().numpy(), quat_to_rotmat(sim.quat_wb[0].double().numpy()),
                      sim.lin_vel_w[0].double().numpy(), sim.ang_vel_b[0].double().numpy())
        p_ned, (roll, pitch, yaw), v_ned, w_frd = ours_to_ned(p, r, v, w)
        self.conn.mav.attitude_send(ms, roll, pitch, yaw, *w_frd)
        self.conn.mav.local_position_ned_send(ms, *p_ned, *v_ned)

    def _heartbeat(self) -> None:
        base = self.m.MAV_MODE_FLAG_CUSTOM_MODE_ENABLED | (self.m.MAV_MODE_FLAG_SAFETY_ARMED if self.armed else 0)
        custom = (self.main_mode << 16) | (self.sub_mode << 24 if self.main_mode == PX4_AUTO else 0)
        self.conn.mav.heartbeat_send(self.m.MAV_TYPE_QUADROTOR, self.m.MAV_AUTOPILOT_PX4, base, custom,
                                     self.m.MAV_STATE_ACTIVE if self.armed else self.m.MAV_STATE_STANDBY)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # kept for ``stop``: a daemon thread's exception is otherwise only printed
            self.error = e
            raise

    def _serve(self) -> None:
        next_tick, next_beat = time.monotonic(), 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            while True:
                msg = self.conn.recv_match(blocking=False)
                if msg is None:
                    break
                with self.lock:
                    self._handle(msg, now)
            with self.lock:
                a = self._action(now)
                if self.armed:  # disarmed, it sits where it is (the simulator has no ground)
                    _, _, term, _, _ = self.env.step(torch.from_numpy(a)[None])
                    self.counts["steps"] += 1
                    self.counts["crashes"] += int(term[0])  # the plant restarts from a new initial state
                self._telemetry()
                if now >= next_beat:
                    self._heartbeat()
                    next_beat = now + 0.5
            next_tick += self.dt
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_tick = time.monotonic()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=14540)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--task", default="quadrotor-hover-rates")
    ap.add_argument("--plant", default="", help="factors, e.g. mass=1.2,thrust=0.9")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    serve(MavlinkVehicle(args.port, args.host, args.task, parse_factors(args.plant), args.seed),
          f"MAVLink vehicle on udpin:{args.host}:{args.port} ({args.task})")

if __name__ == "__main__":
    main()
