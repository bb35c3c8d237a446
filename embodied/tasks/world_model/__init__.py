"""``wm:<task>``: a learned world model of any registered state task, as a task (issue 11).

``make_env("wm:pendulum", model=RUN_DIR)`` steps a fitted model like any ``VecEnv``; ``embodied train --task
wm:pendulum`` (no ``env.model``) collects real pendulum steps, fits the model as it goes and trains the learner
in it (``imagination.py``), and evaluates on the real task. The config is ``WorldModelConfig`` plus ``base``, the
real task's own config (``env.base.*``)."""

from __future__ import annotations

import dataclasses
import re
from functools import partial

from embodied.core.errors import UserError
from embodied.core.registry import TASKS, TaskSpec, register_task_family
from embodied.tasks.world_model.env import WorldModelConfig, WorldModelEnv, check_config


def _config_class(task: str, base_cls: type) -> type:
    """``WorldModelConfig`` with a ``base`` field of the real task's config type (one class per real task, kept in
    this module so that configs pickle)."""
    name = "WorldModelConfig_" + re.sub(r"\W", "_", task)
    if name not in globals():
        cls = dataclasses.make_dataclass(name, [("base", base_cls, dataclasses.field(default_factory=base_cls))],
                                         bases=(WorldModelConfig,))
        cls.__module__ = __name__
        globals()[name] = cls
    return globals()[name]


def _source(task: str, cfg) -> tuple[str, object]:
    return task, cfg.base


def _imagination(run_cfg, learner_device, run_dir):
    """The second collector of a run that learns its model while training; None where ``env.model`` is given
    (the run trains in that fixed model like in any task)."""
    check_config(run_cfg.env)
    if run_cfg.env.model:
        return None
    from embodied.tasks.world_model.imagination import Imagination

    return Imagination(run_cfg, learner_device, run_dir)


def _judge(run_cfg, learner_device, imagination):
    """``score(act, episodes, learner_device)``: a policy's imagined return (``log.keep_best_by=model``) in the model
    the run learns, or in the fitted model it trains in (``env.model``)."""
    if imagination is not None:
        return imagination.imagined_return
    from embodied.tasks.world_model.judge import ModelJudge

    task = run_cfg.task.split(":", 1)[1]
    steps = WorldModelEnv.spaces_of(task, run_cfg.env.base)["max_episode_steps"]
    return ModelJudge(run_cfg.env, task, learner_device, run_cfg.seed + 113, steps).score


def _family(task: str) -> TaskSpec:
    base = TASKS.get(task)
    if base.source is not None:
        raise UserError(f"wm:{task}: {task} is itself a learned model")
    return TaskSpec(name=f"wm:{task}", make=partial(WorldModelEnv, task=task),
                    config_cls=_config_class(task, base.config_cls),
                    description=f"a learned model of {task}", backends=("world_model",),
                    success_metric=None, default_algo="sac", source=partial(_source, task),
                    imagination=_imagination, judge=_judge, tags=("world-model",))


register_task_family("wm", _family, "a learned world model of any state task: wm:<task> (issue 11)")

__all__ = ["WorldModelConfig", "WorldModelEnv"]
