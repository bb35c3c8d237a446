"""The settings tables (embodied/core/settings.py): each rule's edges, nesting, and every registered learner's and
task's defaults pass (the tables never refuse what the project ships)."""

import dataclasses
import re

import pytest

import embodied.algos  # noqa: F401  (registers the learners)
import embodied.tasks  # noqa: F401  (registers the tasks)
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS, TASKS
from embodied.core.settings import LEARNER, TASK, check_settings


@dataclasses.dataclass
class Inner:
    friction: list = dataclasses.field(default_factory=lambda: [0.5, 1.5])


@dataclasses.dataclass
class Outer:
    episode_steps: int = 10
    gamma: float = 0.99
    tau: float | None = None
    control_hz: float = 20.0
    object_xy: list = dataclasses.field(default_factory=lambda: [0.1, 0.0])
    inner: Inner = dataclasses.field(default_factory=Inner)


RULES = {**LEARNER, **TASK}


@pytest.mark.parametrize("field,value,ok", [
    ("episode_steps", 1, True), ("episode_steps", 0, False), ("episode_steps", 2.0, False),
    ("episode_steps", True, False),
    ("gamma", 1.0, True), ("gamma", 0.0, False), ("gamma", 1.0000001, False), ("gamma", float("nan"), False),
    ("tau", None, True), ("tau", 0.5, True), ("tau", 2.0, False),
    ("control_hz", 1e-9, True), ("control_hz", 0.0, False), ("control_hz", float("inf"), False),
    ("object_xy", [0.0, 0.0], True), ("object_xy", [0.1, -0.1], False),
])
def test_each_rule_at_its_edges(field, value, ok):
    cfg = dataclasses.replace(Outer(), **{field: value})
    if ok:
        check_settings("env", cfg, RULES)
    else:
        with pytest.raises(UserError, match=rf"^env\.{field} must be .*, got {re.escape(repr(value))}$"):
            check_settings("env", cfg, RULES)


@pytest.mark.parametrize("value,ok", [([0.5, 1.5], True), ([1.0, 1.0], True), ([1.3, 0.7], False), ([0.0, 1.0], False),
                                      ([1.0], False), (0.1, True), (-0.1, False)])
def test_factor_ranges_nested(value, ok):
    cfg = Outer(inner=Inner(friction=value))
    if ok:
        check_settings("env", cfg, RULES)
    else:
        with pytest.raises(UserError, match=r"^env\.inner\.friction must be \[lo, hi\]"):
            check_settings("env", cfg, RULES)


@pytest.mark.parametrize("name", ALGOS.names())
def test_every_learners_defaults_pass(name):
    check_settings(name, ALGOS.get(name).config_cls(), LEARNER)


@pytest.mark.parametrize("name", TASKS.names())
def test_every_tasks_defaults_and_preset_pass(name):
    from embodied.config import load_config

    check_settings("env", TASKS.get(name).config_cls(), TASK)
    load_config(name)  # the task's preset too (configs/<task>.yaml), which load_config checks
