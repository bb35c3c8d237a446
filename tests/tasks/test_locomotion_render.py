"""MuJoCo tasks draw frames offscreen (EGL/OSMesa on a headless machine) for `embodied eval --video`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embodied
from embodied.core.errors import UserError
from embodied.sim_backends.mujoco_cpu.render import gl_error


@pytest.mark.parametrize("task", ["halfcheetah", "hopper", "walker2d", "ant", "humanoid"])
def test_locomotion_task_renders_the_world_it_is_asked_for(task):
    env = embodied.make_env(task, num_envs=2)
    if not env.can_render:  # a machine without EGL, OSMesa or a display
        with pytest.raises(UserError, match="OpenGL|rendering"):
            env.render_frame(0)
        pytest.skip(gl_error())
    env.reset(seed=0)
    first = env.render_frame(0)
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3
    assert first.std() > 10, "a frame of one colour: nothing was drawn"
    assert np.array_equal(env.render_frame(1), env.render_frame(1)), "rendering must not change the state"
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        env.step(torch.rand(2, env.single_action_space.shape[0], generator=g) * 0.8 - 0.4)
    # the tracking camera follows each world's torso; another world or another state is another frame
    assert not np.array_equal(env.render_frame(0), first)
    env.close()
