"""Rendering is part of the task contract: every task declares ``control_dt``; ``can_render`` says whether
``render_frame`` draws an RGB ``uint8 [H, W, 3]`` frame; without a renderer ``render_frame`` and
``embodied eval --video`` are one-line user errors."""

from __future__ import annotations

import numpy as np
import pytest

import embodied
import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.cli import main
from embodied.core.errors import UserError
from embodied.core.registry import TASKS

TASK_NAMES = TASKS.names()


@pytest.mark.parametrize("task", TASK_NAMES)
def test_every_task_declares_control_dt_and_renders_if_it_can(task):
    env = embodied.make_env(task, num_envs=2)
    assert isinstance(env.control_dt, float) and env.control_dt > 0
    env.reset(seed=0)
    if env.can_render:
        frame = env.render_frame(1)
        assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8
        assert frame.ndim == 3 and frame.shape[2] == 3 and frame.shape[0] > 10 and frame.shape[1] > 10
    else:
        with pytest.raises(UserError, match="has no renderer"):
            env.render_frame()


def test_which_tasks_render():
    assert embodied.make_env("pendulum").can_render and embodied.make_env("quadrotor-hover").can_render
    assert not embodied.make_env("target").can_render


def test_eval_video_without_renderer_is_one_line_error(tmp_path, capfd):
    run = tmp_path / "run"
    assert main(["train", "--task", "target", "--preset", "debug", "--run-dir", str(run), "total_steps=64",
                 "log.progress=false", "log.tensorboard=false"]) == 0
    capfd.readouterr()
    rc = main(["eval", "--run", str(run), "--episodes", "2", "--video"])
    out, err = capfd.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "'target'" in lines[0] and "no renderer" in lines[0]
    assert not (run / "videos").exists()
