"""What sits between the policy and the driver: the lifecycle state machine, the safety filter, the
watchdog and the latched e-stop. Everything counts in control ticks, never in wall time, so a test can
check a trip latency exactly (reference subsystems.md 6.6)."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


class Mode(str, enum.Enum):
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    ARMED = "armed"
    ACTIVE = "active"
    HOLD = "hold"
    LANDING = "landing"
    ESTOP = "estop"
    FAULT = "fault"
    DISARMED = "disarmed"


M = Mode
TRANSITIONS: dict[Mode, set[Mode]] = {
    M.DISCONNECTED: {M.CONNECTED, M.FAULT},
    M.CONNECTED: {M.ARMED, M.DISCONNECTED, M.ESTOP, M.FAULT},
    M.ARMED: {M.ACTIVE, M.DISARMED, M.ESTOP, M.FAULT},
    M.ACTIVE: {M.HOLD, M.LANDING, M.ESTOP, M.FAULT, M.DISARMED},
    M.HOLD: {M.ACTIVE, M.LANDING, M.ESTOP, M.FAULT, M.DISARMED},
    M.LANDING: {M.DISARMED, M.ESTOP, M.FAULT},
    M.ESTOP: {M.DISARMED},
    M.FAULT: {M.DISARMED, M.ESTOP},
    M.DISARMED: {M.ARMED, M.DISCONNECTED, M.ESTOP},
}


class IllegalTransition(RuntimeError):
    pass


@dataclass
class Transition:
    tick: int
    src: str
    dst: str
    reason: str


class Lifecycle:
    """disconnected -> connected -> armed -> active -> hold / landing / estop / fault -> disarmed; every
    transition is logged (``history`` and the ``on_transition`` callback)."""

    def __init__(self, on_transition: Callable[[Transition], None] | None = None):
        self.mode = Mode.DISCONNECTED
        self.history: list[Transition] = []
        self.on_transition = on_transition

    def to(self, dst: Mode, tick: int, reason: str) -> None:
        if dst == self.mode:
            return
        if dst not in TRANSITIONS[self.mode]:
            raise IllegalTransition(f"{self.mode.value} -> {dst.value} ({reason})")
        t = Transition(tick, self.mode.value, dst.value, reason)
        self.mode = dst
        self.history.append(t)
        if self.on_transition:
            self.on_transition(t)

    @property
    def flying(self) -> bool:
        return self.mode in (Mode.ARMED, Mode.ACTIVE, Mode.HOLD, Mode.LANDING)


class EStop:
    """Latched: once tripped it stays tripped until ``reset()`` is called explicitly."""

    def __init__(self):
        self.latched = False
        self.reason = ""

    def trip(self, reason: str) -> None:
        if not self.latched:
            self.latched, self.reason = True, reason

    def reset(self) -> None:
        self.latched, self.reason = False, ""


@dataclass
class SafetyConfig:
    max_rate: float | None = None  # [action units / s] per entry; None: no rate limit
    geofence_radius: float | None = None  # [m] from the origin of the position term; None: no fence
    geofence_box: tuple[float, ...] | None = None  # (xmin, xmax, ymin, ymax, zmin, zmax) [m]
    # a residual over a base policy: |action - base action| <= residual_limit per entry [normalized action
    # units]; None: the bundle's own limit (the one it was trained with), for a residual bundle
    residual_limit: float | list[float] | None = None  # (a list: one bound per entry)


@dataclass
class Interventions:
    nonfinite_action: int = 0  # NaN/Inf actions replaced by the fallback
    clipped: int = 0  # ticks with an entry clipped to the action bounds
    rate_limited: int = 0  # ticks with an entry rate-limited
    geofence: int = 0  # geofence trips
    nonfinite_state: int = 0  # states with NaN/Inf (treated as stale, never fed to the policy)
    residual_limited: int = 0  # ticks with a residual entry bounded to the limit around the base's action

    def total(self) -> int:
        return (self.nonfinite_action + self.clipped + self.rate_limited + self.geofence + self.nonfinite_state
                + self.residual_limited)


@dataclass
class SafetyFilter:
    """NaN/Inf -> fallback action, a residual policy's correction bounded ``|a - base| <= residual_limit`` (given the
    base's action), clip to the bounds, rate limit ``|a_t - a_{t-1}| <= max_rate dt``."""

    low: np.ndarray
    high: np.ndarray
    dt: float
    cfg: SafetyConfig = field(default_factory=SafetyConfig)
    counts: Interventions = field(default_factory=Interventions)

    def __post_init__(self):
        self.low, self.high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        self.previous: np.ndarray | None = None

    def reset(self, previous: np.ndarray | None = None) -> None:
        self.previous = None if previous is None else np.asarray(previous, np.float32).copy()

    def __call__(self, action: np.ndarray, fallback: np.ndarray,
                 base: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
        a = np.asarray(action, np.float32).reshape(self.low.shape)
        events = []
        if not np.all(np.isfinite(a)):
            a = np.asarray(fallback, np.float32).copy()
            self.counts.nonfinite_action += 1
            events.append("nonfinite_action")
        elif base is not None and self.cfg.residual_limit is not None and np.all(np.isfinite(base)):
            lim = np.asarray(self.cfg.residual_limit, np.float32)
            b = np.asarray(base, np.float32).reshape(self.low.shape)
            r = np.clip(a, b - lim, b + lim)
            if np.any(r != a):
                self.counts.residual_limited += 1
                events.append("residual_limited")
            a = r
        c = np.clip(a, self.low, self.high)
        if np.any(c != a):
            self.counts.clipped += 1
            events.append("clipped")
        a = c
        if self.cfg.max_rate is not None and self.previous is not None:
            step = self.cfg.max_rate * self.dt
            r = np.clip(a, self.previous - step, self.previous + step)
            if np.any(r != a):
                self.counts.rate_limited += 1
                events.append("rate_limited")
            a = r
        self.previous = a.copy()
        return a, events

    def outside_fence(self, position: np.ndarray | None) -> bool:
        if position is None:
            return False
        p = np.asarray(position, np.float64)
        if not np.all(np.isfinite(p)):
            return True
        if self.cfg.geofence_radius is not None and float(np.linalg.norm(p)) > self.cfg.geofence_radius:
            return True
        box = self.cfg.geofence_box
        if box is not None:
            lo, hi = np.array(box[0::2]), np.array(box[1::2])
            return bool(np.any(p[: lo.size] < lo) or np.any(p[: hi.size] > hi))
        return False


@dataclass
class WatchdogConfig:
    stale_ticks: int = 1  # a state not refreshed for more than this many ticks is stale
    recover_ticks: int = 3  # fresh ticks in a row that end a hold
    hold_ticks: int = 50  # ticks in hold before landing
    land_ticks: int = 100  # ticks of landing before disarming


class Watchdog:
    """Per tick: ``update(fresh_state, command_ok)`` -> ``"ok" | "hold" | "land"``. A state that has not been
    refreshed for more than ``stale_ticks`` ticks (default 1: the last fresh state is 2 ticks old), or a missing
    command (the policy failed or missed its deadline), asks for a hold in that tick, so the hold starts within
    2 control periods of the last fresh state; ``hold_ticks`` in hold without ``recover_ticks`` good ticks in a
    row ask for landing."""

    def __init__(self, cfg: WatchdogConfig | None = None):
        self.cfg = cfg or WatchdogConfig()
        self.since_fresh = 0
        self.fresh_run = 0
        self.in_hold = 0
        self.trips = 0

    def update(self, fresh_state: bool, command_ok: bool = True) -> str:
        self.since_fresh = 0 if fresh_state else self.since_fresh + 1
        good = fresh_state and command_ok
        self.fresh_run = self.fresh_run + 1 if good else 0
        bad = self.since_fresh > self.cfg.stale_ticks or not command_ok
        if self.in_hold:
            if self.fresh_run >= self.cfg.recover_ticks:
                self.in_hold = 0
                return "ok"
            self.in_hold += 1
            return "land" if self.in_hold > self.cfg.hold_ticks else "hold"
        if bad:
            self.in_hold, self.trips = 1, self.trips + 1
            return "hold"
        return "ok"


def isfinite(values: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(values)))


def jitter_stats(lateness_s: list[float]) -> dict[str, float]:
    """p50 / p99 / max of how late ticks started [ms]."""
    if not lateness_s:
        return {"p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan}
    a = np.asarray(lateness_s) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}
