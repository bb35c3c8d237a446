"""Observation and action layouts as data: what each entry of an observation group and of the action
means (name, size, unit, frame, order, scaling, limits) and the control rate. A task declares its layout
once (``VecEnv.layout()``); export writes it into the deploy bundle and the deploy side reads it from
there, so nothing is written twice.

A term's ``source`` says who provides it on a robot: ``"robot"`` terms are reported by the robot (its
state estimate); ``"history"`` terms are the last ``history_len`` actions, kept by the deploy runner
itself (oldest first, ``history_init`` after a reset), exactly as the task keeps them in simulation;
``"instruction"`` terms are the embedding of a language instruction (``embodied.vla.text``), which the deploy side
looks up for the instruction it is given; ``"average"`` terms are an exponential average of one robot term
(``average_of``, same size) that the deploy runner keeps from what the robot reports: the term's value at the
first step after a reset, then ``avg = average_decay * avg + (1 - average_decay) * value`` every step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from embodied.core.errors import UserError


def np_prod(shape) -> int:
    out = 1
    for v in shape:
        out *= int(v)
    return out

SOURCES = ("robot", "history", "instruction", "average")


@dataclass(frozen=True)
class Term:
    """``size`` consecutive entries of an observation group."""

    name: str
    size: int
    unit: str = ""  # SI unit of the values as the policy sees them ("m", "m/s", "rad/s", "1" for unitless)
    frame: str = ""  # "world", "body", ... ("" where no frame applies)
    description: str = ""
    source: str = "robot"  # one of SOURCES
    history_len: int = 0  # history terms: how many past actions (size = history_len * action size)
    history_init: float = 0.0  # history terms: the value of every slot after a reset
    average_of: str = ""  # average terms: the robot term averaged
    average_decay: float = 0.0  # average terms: the per-step decay (exp(-dt / time constant))
    shape: tuple[int, ...] = ()  # image terms: (channels, height, width), size = their product, channel-major
    # image terms: the values are uint8 pixels times 1/255 exactly (core/pixels.py), so a store may keep them as uint8
    quantized: bool = False

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(v) for v in self.shape))
        if self.shape and (len(self.shape) != 3 or int(np_prod(self.shape)) != self.size):
            raise ValueError(f"term {self.name!r}: image shape {self.shape} must be (C, H, W) with C*H*W = size")
        if self.size < 1:
            raise ValueError(f"term {self.name!r}: size must be >= 1, got {self.size}")
        if self.quantized and not self.shape:
            raise ValueError(f"term {self.name!r}: only an image term (with a shape) holds quantized pixels")
        if self.source not in SOURCES:
            raise ValueError(f"term {self.name!r}: source must be one of {SOURCES}, got {self.source!r}")
        if self.source == "average" and not (self.average_of and 0.0 <= self.average_decay < 1.0):
            raise ValueError(f"term {self.name!r}: an average term names the robot term it averages (average_of) and "
                             f"a decay in [0, 1), got {self.average_of!r}, {self.average_decay}")


@dataclass(frozen=True)
class ActionTerm:
    """``size`` consecutive entries of the action. The policy's action lies in ``[low, high]`` (normalized);
    the robot applies ``offset + scale * action`` in ``unit``."""

    name: str
    size: int
    unit: str = ""
    low: float = -1.0
    high: float = 1.0
    scale: float = 1.0
    offset: float = 0.0
    description: str = ""


@dataclass(frozen=True)
class Layout:
    """Observation groups (name -> ordered terms), the action's ordered terms, and the control rate."""

    observation: Mapping[str, tuple[Term, ...]]
    action: tuple[ActionTerm, ...]
    control_hz: float
    notes: str = ""
    extras: Mapping[str, object] = field(default_factory=dict)  # task-specific data the deploy side needs

    # ---- sizes and slices ----------------------------------------------------------------------
    def group_size(self, group: str) -> int:
        return sum(t.size for t in self.terms(group))

    @property
    def action_size(self) -> int:
        return sum(t.size for t in self.action)

    def terms(self, group: str) -> tuple[Term, ...]:
        try:
            return tuple(self.observation[group])
        except KeyError:
            raise UserError(f"layout has no observation group {group!r}; groups: {', '.join(self.observation)}") \
                from None

    def slices(self, group: str, skip_sources: tuple[str, ...] = ()) -> dict[str, slice]:
        """Each term's entries in the group's vector, or in the vector without the terms of ``skip_sources`` (a
        language bundle's ``obs`` input has no instruction terms)."""
        out, start = {}, 0
        for t in self.terms(group):
            if t.source in skip_sources:
                continue
            out[t.name] = slice(start, start + t.size)
            start += t.size
        return out

    def images(self, group: str = "policy") -> list[tuple[slice, tuple[int, int, int]]]:
        """Where the group's image terms lie and their (C, H, W): what picks a CNN encoder for a policy."""
        return [(self.slices(group)[t.name], t.shape) for t in self.terms(group) if t.shape]

    def robot_terms(self, group: str = "policy") -> tuple[Term, ...]:
        """The terms a robot reports (in order); the rest the deploy runner builds."""
        return tuple(t for t in self.terms(group) if t.source == "robot")

    def robot_size(self, group: str = "policy") -> int:
        return sum(t.size for t in self.robot_terms(group))

    def check(self, spaces: Mapping[str, tuple[int, ...]], action_shape: tuple[int, ...]) -> None:
        """The layout describes exactly these observation shapes and this action shape (a task's bug if not)."""
        for group, shape in spaces.items():
            if group in self.observation and (self.group_size(group),) != tuple(shape):
                raise ValueError(f"layout of group {group!r} has {self.group_size(group)} entries, space {shape}")
        if (self.action_size,) != tuple(action_shape):
            raise ValueError(f"action layout has {self.action_size} entries, space {action_shape}")
        for t in self.terms("policy"):
            if t.source == "history" and t.size != t.history_len * self.action_size:
                raise ValueError(f"history term {t.name!r}: size {t.size} != {t.history_len} x {self.action_size}")
            if t.source == "average":
                src = next((s for s in self.robot_terms("policy") if s.name == t.average_of), None)
                if src is None or src.size != t.size:
                    raise ValueError(f"average term {t.name!r}: {t.average_of!r} is not a robot term of size {t.size}")

    # ---- plain data ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"observation": {g: [asdict(t) for t in ts] for g, ts in self.observation.items()},
                "action": [asdict(t) for t in self.action], "control_hz": self.control_hz, "notes": self.notes,
                "extras": dict(self.extras)}

    @classmethod
    def from_dict(cls, d: Mapping) -> Layout:
        try:
            return cls({g: tuple(Term(**t) for t in ts) for g, ts in d["observation"].items()},
                       tuple(ActionTerm(**t) for t in d["action"]), float(d["control_hz"]), d.get("notes", ""),
                       dict(d.get("extras", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"malformed layout: {e}") from None


def generic_layout(spaces: Mapping[str, tuple[int, ...]], action_shape: tuple[int, ...], control_dt: float) -> Layout:
    """The layout of a task that declares none: one robot-provided term per group, one action term."""
    return Layout({g: (Term(g, int(s[0]), description="undeclared by the task"),) for g, s in spaces.items()},
                  (ActionTerm("action", int(action_shape[0]), description="undeclared by the task"),),
                  1.0 / control_dt)
