"""The batched mesh renderer: the numba kernel against its plain-torch reference, and both against MuJoCo's own
renderer (in the configuration it reproduces: no shadows, reflections or multisampling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embodied
from embodied.sim_backends.mujoco_cpu.batch_render import BatchRenderer, mujoco_reference
from embodied.sim_backends.mujoco_cpu.render import gl_error

CAMERAS = ("agentview", "wrist")


@pytest.fixture(scope="module")
def scene(minilm):
    env = embodied.make_env("mini-libero", num_envs=2, seed=0)
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(12):  # the arm moved off its home pose
        env.step(torch.rand(2, 7, generator=g) * 2 - 1)
    yield env
    env.close()


def test_kernel_matches_the_torch_reference(scene):
    r = BatchRenderer(scene.sim, CAMERAS, 24)
    img, seg = r.render(scene.sim, segment=True)
    ref_img, ref_seg = r.render(scene.sim, segment=True, reference=True)
    assert img.shape == (2, 2, 24, 24, 3) and img.dtype == torch.uint8
    same = (seg == ref_seg).float().mean()
    assert same >= 0.995  # pixel centres exactly on a shared edge may go either way (float32 vs float64)
    close = ((img.int() - ref_img.int()).abs().amax(-1) <= 2)[seg == ref_seg].float().mean()
    assert close >= 0.995


@pytest.mark.skipif(gl_error() is not None, reason="no offscreen OpenGL here")
def test_images_match_mujoco_renderer(scene):
    m = scene.sim.model
    size = 64
    r = BatchRenderer(scene.sim, CAMERAS, size)
    img, seg = r.render(scene.sim, segment=True)
    robot = np.flatnonzero([m.body(int(b)).name.startswith("panda") for b in m.geom_bodyid])
    objects = {n: [m.geom(n).id] for n in ("red", "green", "blue", "yellow", "plate", "tray", "table")}
    objects["robot"] = list(robot)
    checked = 0
    for e in range(2):
        for c, cam in enumerate(CAMERAS):
            kw = dict(mocap_pos=scene.sim.t("mocap_pos")[e].numpy())
            ref = mujoco_reference(m, scene.sim.qpos[e].numpy(), cam, size, **kw)
            ref_seg = mujoco_reference(m, scene.sim.qpos[e].numpy(), cam, size, segment=True, **kw)
            mse = (((ref.astype(float) - img[e, c].numpy().astype(float)) / 255.0) ** 2).mean()
            assert 10 * np.log10(1.0 / mse) >= 25.0, (e, cam)
            for name, ids in objects.items():
                a, b = np.isin(ref_seg, ids), np.isin(seg[e, c].numpy(), ids)
                if a.sum() >= 8:  # seen by MuJoCo's camera: silhouettes agree
                    assert (a & b).sum() / (a | b).sum() >= 0.9, (e, cam, name)
                    checked += 1
    assert checked >= 12
