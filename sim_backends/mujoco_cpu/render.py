"""Offscreen frames of one world of a batch, on whatever OpenGL the machine has.

``mujoco.Renderer`` picks its OpenGL platform from ``MUJOCO_GL`` when ``mujoco`` is first imported
(GLFW unless told otherwise, which needs a display). Here the context is made directly, so a
headless machine renders without the user setting anything: EGL or OSMesa where installed, GLFW
with a display (``gl_platform``). The camera tracks the model's first body from 4 m, as gymnasium's
v5 locomotion tasks do."""

from __future__ import annotations

import ctypes.util
import functools
import importlib
import os

import mujoco
import numpy as np

from embodied.core.errors import UserError


def gl_platform() -> str | None:
    """The OpenGL platform to use: ``MUJOCO_GL`` (or PyOpenGL's ``PYOPENGL_PLATFORM``) when set,
    else EGL or OSMesa where the library is installed, else GLFW with a display. Chosen before any
    import, because importing one platform's module pins PyOpenGL to it for the whole process."""
    for var in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):
        chosen = os.environ.get(var, "").lower().strip()
        if chosen in ("egl", "osmesa", "glfw"):
            return chosen
    if ctypes.util.find_library("EGL"):
        return "egl"
    if ctypes.util.find_library("OSMesa"):
        return "osmesa"
    return "glfw" if os.environ.get("DISPLAY") else None


@functools.cache
def gl_error() -> str | None:
    """Why no offscreen context can be made here (None: one can); tried once per process."""
    try:
        _gl_context(16, 16).free()
        return None
    except UserError as e:
        return str(e)


def _gl_context(width: int, height: int):
    name = gl_platform()
    if name is None:
        raise UserError("no OpenGL platform for offscreen rendering: install EGL (libegl1) or OSMesa "
                        "(libosmesa6), or set MUJOCO_GL")
    try:
        module = importlib.import_module(f"mujoco.{name}")
        ctx = module.GLContext(width, height)
        ctx.make_current()
        return ctx
    except Exception as e:  # noqa: BLE001 - each platform fails in its own way
        raise UserError(f"offscreen rendering with {name} failed ({type(e).__name__}: {e}); "
                        "set MUJOCO_GL=egl|osmesa|glfw to pick another platform") from None


class WorldRenderer:
    """``render(qpos, qvel) -> uint8 [H, W, 3]``: the model in that state, seen by a tracking camera, or by the
    model's own camera named ``camera``."""

    def __init__(self, model: mujoco.MjModel, width: int = 480, height: int = 480, distance: float = 4.0,
                 camera: str | None = None):
        self.model = model
        width, height = min(width, model.vis.global_.offwidth), min(height, model.vis.global_.offheight)
        self.ctx = _gl_context(width, height)
        self.data = mujoco.MjData(model)
        self.scene = mujoco.MjvScene(model, maxgeom=10_000)
        self.option = mujoco.MjvOption()
        self.camera = mujoco.MjvCamera()
        mujoco.mjv_defaultFreeCamera(model, self.camera)
        self.camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        self.camera.trackbodyid = 1 if model.nbody > 1 else 0
        self.camera.distance = distance  # [m]; gymnasium's v5 locomotion cameras sit 3-4 m away
        self.camera.elevation = -20.0
        if camera is not None:
            self.camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
            self.camera.fixedcamid = model.camera(camera).id
        self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.viewport = mujoco.MjrRect(0, 0, width, height)

    def render(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        self.ctx.make_current()
        self.data.qpos[:], self.data.qvel[:] = qpos, qvel
        mujoco.mj_forward(self.model, self.data)
        mujoco.mjv_updateScene(self.model, self.data, self.option, None, self.camera,
                               mujoco.mjtCatBit.mjCAT_ALL, self.scene)
        mujoco.mjr_render(self.viewport, self.scene, self.context)
        rgb = np.empty((self.viewport.height, self.viewport.width, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(rgb, None, self.viewport, self.context)
        return np.ascontiguousarray(rgb[::-1])  # OpenGL's rows run bottom-up

    def close(self) -> None:
        if self.ctx is not None:
            self.context.free()
            self.ctx.free()
            self.ctx = None
