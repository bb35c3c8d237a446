"""The fixed-rate control loop: robot -> policy -> safety filter -> robot, on a monotonic clock, with the
lifecycle, the watchdog and the e-stop around it, and a flight log of every tick.

Real-time mode sleeps to each deadline ``t0 + k / rate`` and records how late every tick started (jitter)
and the ticks that started a whole period late (overruns; missed slots are skipped, never caught up).
Lock-step mode runs each tick as soon as the last one ended (a simulated plant that waits for each action).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from embodied.core.errors import UserError
from embodied.hardware.robot import Robot, RobotError
from embodied.hardware.safety import (
    EStop,
    Lifecycle,
    Mode,
    SafetyConfig,
    SafetyFilter,
    Transition,
    Watchdog,
    WatchdogConfig,
    isfinite,
    jitter_stats,
)


@dataclass
class LoopConfig:
    rate_hz: float
    duration_s: float | None = None  # stop (land, disarm) after this much flight time; None: ticks/episodes
    max_ticks: int | None = None
    episodes: int | None = None  # stop after the robot reports this many episode ends (simulated robots)
    lockstep: bool = False
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    log_path: Path | None = None
    log_states: bool = True  # state and action vectors in every log row
    status: bool = True  # a live status line on stderr
    status_every_s: float = 0.5


class ControlLoop:
    """``run() -> summary``. ``policy`` is a bundle runner (``act(state) -> action``, ``reset()``), or None
    when the robot runs its own (``Robot.policy_action``: the serial firmware)."""

    def __init__(self, robot: Robot, policy, cfg: LoopConfig, estop: EStop | None = None):
        self.robot, self.policy, self.cfg = robot, policy, cfg
        self.period = 1.0 / cfg.rate_hz
        layout = robot.layout
        low = np.array([t.low for t in layout.action for _ in range(t.size)], np.float32)
        high = np.array([t.high for t in layout.action for _ in range(t.size)], np.float32)
        safety = cfg.safety
        bound = getattr(policy, "residual_limit", None)  # a residual bundle: its residual is bounded here too
        if bound is not None and safety.residual_limit is None:
            safety = replace(safety, residual_limit=bound)
        elif bound is None and safety.residual_limit is not None:
            raise UserError("a residual limit was given, but the policy is no residual over a base (or it runs on the "
                            "robot, where its graph bounds the residual)")
        self.safety = SafetyFilter(low, high, self.period, safety)
        self.watchdog = Watchdog(cfg.watchdog)
        self.estop = estop or EStop()  # share one between flights: a latched e-stop blocks the next arming
        self._log = None  # opened by run(), closed when it ends
        self.lifecycle = Lifecycle(self._log_transition)
        self.tick = 0
        self.lateness: list[float] = []  # how late each tick started [s] (real time)
        self.finish_slack: list[float] = []  # time left to the next deadline when the command was sent [s]
        self.policy_s: list[float] = []
        self.overruns = 0
        self.missed_commands = 0
        self.episode_ends: list[dict] = []
        self._stop_reason: str | None = None
        self._land_ticks = 0
        self._interrupts = 0

    # ---- log ---------------------------------------------------------------------------------------
    def _log_transition(self, t: Transition) -> None:
        self.robot.on_mode(t.dst)  # a driver whose robot flies itself (an onboard controller) follows the mode
        if self._log:
            self._log.write(json.dumps({"transition": asdict(t), "t": time.monotonic()}) + "\n")

    def _row(self, t: float, late: float, state, action, applied, policy_s, events) -> None:
        if not self._log:
            return
        row = {"tick": self.tick, "t": round(t, 6), "mode": self.lifecycle.mode.value, "late_ms": round(late * 1e3, 4),
               "policy_us": None if policy_s is None else round(policy_s * 1e6, 2)}
        if self.cfg.log_states:
            row["state"] = [round(float(v), 6) for v in state.values]
            row["action"] = None if action is None else [round(float(v), 6) for v in action]
            row["applied"] = None if applied is None else [round(float(v), 6) for v in applied]
        if events:
            row["events"] = events
        if state.info.get("episode_end"):
            row["episode_end"] = state.info["episode_end"]
        self._log.write(json.dumps(row) + "\n")

    # ---- control ----------------------------------------------------------------------------------
    def request_estop(self, reason: str = "operator") -> None:
        self.estop.trip(reason)

    def request_stop(self, reason: str = "operator") -> None:
        """Land and disarm (what Ctrl-C does; a second one is an e-stop)."""
        self._interrupts += 1
        if self._interrupts > 1:
            self.estop.trip("second interrupt")
        self._stop_reason = self._stop_reason or reason

    def _compute(self, state) -> tuple[np.ndarray | None, float]:
        t0 = time.perf_counter()
        try:
            a = self.robot.policy_action(state) if self.policy is None else self.policy.act(state.values)
        except RobotError:
            raise
        except Exception as e:  # a failing policy is a missing command (hold), and logged
            self._policy_error = f"{type(e).__name__}: {e}"
            return None, time.perf_counter() - t0
        return a, time.perf_counter() - t0

    def _reset_policy(self) -> None:
        """A new episode or a recovery: the policy's history restarts; the safety filter's last command does not
        (the rate limit holds across the switch)."""
        if self.policy is not None:
            self.policy.reset()
        self.robot.reset_policy()

    def run(self) -> dict:
        """Connect, arm, fly until the flight ends (its duration, ticks or episodes; a stop, an e-stop, a fault),
        disarm; returns the summary (also the log's last row)."""
        cfg = self.cfg
        self._outcome, fault = "completed", None  # "estop" is set before the robot is told (its call may raise)
        t_start = time.monotonic()
        if self.estop.latched:
            raise UserError(f"the e-stop is latched ({self.estop.reason}); reset it before arming")
        if cfg.log_path:
            self._log = open(cfg.log_path, "w")  # noqa: SIM115 - closed in the finally below
        try:
            self._arm()
            self._fly(t_start)
            if self.lifecycle.mode not in (Mode.DISARMED, Mode.ESTOP):
                self.robot.disarm()
                self.lifecycle.to(Mode.DISARMED, self.tick, "stopped")
        except (RobotError, OSError) as e:
            self._outcome, fault = "fault", f"{type(e).__name__}: {e}"
            self._disarm_after(fault)
        finally:
            gc.unfreeze()
            if cfg.status:
                self._print_status(time.monotonic() - (self._t_loop or t_start), final=True)
            summary = self.summary(time.monotonic() - t_start, self._outcome, fault)
            if self._log:
                self._log.write(json.dumps({"summary": summary}) + "\n")
                self._log.close()
        return summary

    def _arm(self) -> None:
        lc = self.lifecycle
        lc.to(Mode.CONNECTED, 0, "link open")
        # everything allocated so far (torch, the simulator, the bundle) moves out of the collector's reach: a
        # full collection of a heap that size stalled a 100 Hz loop for ~120 ms once per run. Before arming:
        # between arming and the first tick the set-point stream must not pause (a PX4 vehicle's offboard
        # failsafe took over after a 0.5 s collection of a large test process's heap)
        gc.collect()
        gc.freeze()
        self.robot.arm()
        lc.to(Mode.ARMED, 0, "armed")
        self._reset_policy()
        self._compute(self.robot.observe())  # warm-up call, not applied: the first tick is not the slow one
        self._reset_policy()
        lc.to(Mode.ACTIVE, 0, "control loop started")

    def _fly(self, t_start: float) -> None:
        """The ticks, until the flight ends (an e-stop sets ``_outcome``)."""
        cfg, robot = self.cfg, self.robot
        status_every = cfg.status_every_s if sys.stderr.isatty() else max(cfg.status_every_s, 5.0)
        last_status, last_seq = t_start, None
        t0 = self._t_loop = time.monotonic()
        deadline = t0
        while True:
            now = time.monotonic()
            late, deadline = self._pace(now, deadline)
            if self.estop.latched:
                self._outcome = "estop"
                self._estop()
                return
            if self._end_of_flight(now - t0):
                return
            state = robot.observe()
            fresh, finite = state.seq != last_seq, isfinite(state.values)
            last_seq = state.seq
            if not finite:  # never fed to the policy: a stale state for the watchdog
                self.safety.counts.nonfinite_state += 1
                fresh = False
            if state.info.get("episode_end"):
                self.episode_ends.append(state.info["episode_end"])
            if state.info.get("new_episode") and self.tick > 0:
                self._reset_policy()
            step = self._command(state, fresh, finite)
            if step is None:  # landed and disarmed
                return
            command, action, policy_s, events = step
            applied = robot.send_action(command)
            if not cfg.lockstep:  # on time: the command reached the robot before the next tick's deadline
                self.finish_slack.append(deadline + self.period - time.monotonic())
            self._row(time.monotonic() - t_start, late, state, action, applied, policy_s, events)
            self.tick += 1
            if cfg.status and time.monotonic() - last_status >= status_every:
                last_status = time.monotonic()
                self._print_status(now - t0)
            if not cfg.lockstep:
                deadline += self.period
                pause = deadline - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            self._t_end = time.monotonic()

    def _pace(self, now: float, deadline: float) -> tuple[float, float]:
        """How late this tick starts [s], and its deadline: a whole slot missed is counted and skipped, never
        caught up. Lock-step ticks are never late."""
        if self.cfg.lockstep:
            return 0.0, deadline
        late = max(0.0, now - deadline)
        self.lateness.append(late)
        if late >= self.period:
            missed = int(late // self.period)
            self.overruns += missed
            deadline += missed * self.period
        return late, deadline

    def _estop(self) -> None:
        self.lifecycle.to(Mode.ESTOP, self.tick, f"e-stop: {self.estop.reason}")
        try:
            self.robot.estop()
        finally:  # whatever the link did, the HAL side is disarmed
            self.lifecycle.to(Mode.DISARMED, self.tick, "e-stop")

    def _end_of_flight(self, elapsed: float) -> bool:
        """Starts the landing when the flight's duration is over or a stop was asked for; True when a measured run
        (ticks or episodes) is over, which stops at once."""
        cfg, lc = self.cfg, self.lifecycle
        done = ((cfg.duration_s is not None and elapsed >= cfg.duration_s)
                or (cfg.max_ticks is not None and self.tick >= cfg.max_ticks)
                or (cfg.episodes is not None and len(self.episode_ends) >= cfg.episodes))
        if done and lc.mode in (Mode.ACTIVE, Mode.HOLD):
            if cfg.episodes is not None or cfg.max_ticks is not None:
                return True
            lc.to(Mode.LANDING, self.tick, "end of flight")
        if self._stop_reason and lc.mode in (Mode.ACTIVE, Mode.HOLD):
            lc.to(Mode.LANDING, self.tick, self._stop_reason)
        return False

    def _command(self, state, fresh: bool, finite: bool):
        """This tick's command for the mode, through the safety filter: ``(command, action, policy_s, events)``,
        or None once the landing is over (the robot disarmed) or in a mode that sends nothing."""
        lc, robot = self.lifecycle, self.robot
        events: list[str] = []
        action, policy_s = None, None
        if lc.mode in (Mode.ACTIVE, Mode.HOLD):
            verdict = self.watchdog.update(fresh, self._command_ok)
            if verdict == "hold" and lc.mode == Mode.ACTIVE:
                lc.to(Mode.HOLD, self.tick, "stale state" if not fresh else "missing command")
            elif verdict == "ok" and lc.mode == Mode.HOLD:
                lc.to(Mode.ACTIVE, self.tick, "recovered")
                self._reset_policy()
            elif verdict == "land":
                lc.to(Mode.LANDING, self.tick, "hold timed out")
        if lc.mode == Mode.ACTIVE:
            command, action, policy_s = self._active(state, fresh, finite, events)
        elif lc.mode == Mode.HOLD:
            if fresh:  # the policy still runs (not applied): a hold for a missing command ends when it is back
                action, policy_s = self._compute(state)
                self._command_ok = action is not None and policy_s <= self.period
            command, ev = self.safety(robot.hold_action(), robot.hold_action())
            events += ev
        elif lc.mode == Mode.LANDING:
            command, ev = self.safety(robot.land_action(), robot.land_action())
            events += ev
            self._land_ticks += 1
            if self._land_ticks > self.cfg.watchdog.land_ticks:
                robot.disarm()
                lc.to(Mode.DISARMED, self.tick, "landed")
                return None
        else:
            return None
        return command, action, policy_s, events

    def _active(self, state, fresh: bool, finite: bool, events: list[str]):
        """The policy's action (the hold action when it has none in time), filtered; the geofence lands."""
        robot = self.robot
        action, policy_s = None, None
        if finite:
            action, policy_s = self._compute(state)
            self.policy_s.append(policy_s)
            self._command_ok = action is not None and policy_s <= self.period
            if not self._command_ok:
                self.missed_commands += 1
                events.append("missed_command")
        else:
            events.append("nonfinite_state")
        command = action if action is not None else robot.hold_action()
        base = getattr(self.policy, "base_action", None) if action is not None else None
        command, ev = self.safety(command, robot.hold_action(), base)
        events += ev
        # a missing or non-finite state is the watchdog's business, not a fence breach
        if fresh and self.safety.outside_fence(robot.position(state)):
            self.safety.counts.geofence += 1
            events.append("geofence")
            self.lifecycle.to(Mode.LANDING, self.tick, "geofence")
            command, _ = self.safety(robot.land_action(), robot.land_action())
        return command, action, policy_s

    def _disarm_after(self, fault: str) -> None:
        lc = self.lifecycle
        if lc.mode in (Mode.DISARMED, Mode.DISCONNECTED):
            return
        if lc.mode != Mode.ESTOP:
            lc.to(Mode.FAULT, self.tick, fault)
        try:
            self.robot.disarm()
        except (RobotError, OSError):
            pass  # the link is gone: nothing more reaches the robot
        finally:
            lc.to(Mode.DISARMED, self.tick, "fault")

    _command_ok = True
    _outcome = "completed"  # completed | estop | fault
    _policy_error: str | None = None
    _t_loop = _t_end = 0.0  # when the control clock started (after arming) and when its last tick ended

    def summary(self, wall: float, outcome: str, fault: str | None) -> dict:
        ticks = self.tick
        on_time = sum(1 for x in self.finish_slack if x >= 0.0)
        ends = self.episode_ends
        out = {
            "outcome": outcome, "fault": fault, "ticks": ticks, "wall_s": wall, "rate_hz": self.cfg.rate_hz,
            "achieved_hz": ticks / (self._t_end - self._t_loop) if ticks and self._t_end > self._t_loop else 0.0,
            "lockstep": self.cfg.lockstep,
            "overruns": self.overruns,
            # missed slots count as late ticks
            "on_time_fraction": on_time / (len(self.finish_slack) + self.overruns) if self.finish_slack else None,
            "jitter": jitter_stats(self.lateness), "missed_commands": self.missed_commands,
            "policy_us_mean": float(np.mean(self.policy_s) * 1e6) if self.policy_s else None,
            "interventions": asdict(self.safety.counts), "watchdog_trips": self.watchdog.trips,
            "transitions": [asdict(t) for t in self.lifecycle.history], "robot": self.robot.status(),
            "policy_error": self._policy_error,
        }
        if ends:
            out["episodes"] = len(ends)
            out["success_rate"] = sum(bool(e.get("success")) for e in ends) / len(ends)
        return out

    def _print_status(self, elapsed: float, final: bool = False) -> None:
        hz = self.tick / elapsed if elapsed > 0 else 0.0
        eps = f"  episodes {len(self.episode_ends)} ({sum(bool(e.get('success')) for e in self.episode_ends)} ok)" \
            if self.episode_ends else ""
        line = (f"t {elapsed:6.1f}s  rate {hz:7.1f} Hz  overruns {self.overruns}  "
                f"interventions {self.safety.counts.total()}  mode {self.lifecycle.mode.value}{eps}")
        if sys.stderr.isatty():
            print("\r" + line, end="\n" if final else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)
