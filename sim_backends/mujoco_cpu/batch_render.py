"""Camera images of every env of a ``MujocoBatch`` at once, from a triangle soup of the model's visible geometry and
the batch's geom and camera poses (``kernels/mesh_raster_numba.py``; a plain-torch reference beside it in
``raster_reference.py``), in place of one ``mujoco.Renderer`` call per env and camera.

The geometry: the visible geoms (groups 0-2, as MuJoCo's default ``mjvOption``): boxes (12 triangles), planes (2)
and meshes. A mesh with more than ``max_faces`` faces (the Franka's visual meshes: 7k-22k faces each, 136k in all)
is drawn as its body's collision meshes (group 3, 200-300 faces each) in its colour: the silhouettes differ by a
few millimetres. Lighting and materials are MuJoCo's defaults (headlight, the model's lights with their spot cones,
Blinn-Phong specular 0.5 at shininess 64); shadows, reflections and multisampling are left out. The reference to
check against is MuJoCo's renderer in that configuration (``mujoco_reference``)."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import torch

from embodied.core.errors import UserError

DRAWN = (mujoco.mjtGeom.mjGEOM_BOX, mujoco.mjtGeom.mjGEOM_PLANE, mujoco.mjtGeom.mjGEOM_MESH)
SPEC, SHININESS = 0.5, 64.0  # MuJoCo's default material: specular 0.5, shininess 0.5 (x 128 in OpenGL)
PLANE_INFINITE = 50.0  # [m] half size drawn for an infinite plane (size 0)


def _box_triangles(half) -> np.ndarray:
    hx, hy, hz = half
    v = np.array([[sx * hx, sy * hy, sz * hz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    # faces as quads of corner indices (index = 4 * (x > 0) + 2 * (y > 0) + (z > 0)), counter-clockwise from outside
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
    return np.array([[v[a], v[b], v[c]] for q in quads for a, b, c in ((q[0], q[1], q[2]), (q[0], q[2], q[3]))])


def _plane_triangles(size) -> np.ndarray:
    hx = size[0] if size[0] > 0 else PLANE_INFINITE
    hy = size[1] if size[1] > 0 else PLANE_INFINITE
    v = np.array([[-hx, -hy, 0], [hx, -hy, 0], [hx, hy, 0], [-hx, hy, 0]])
    return np.array([[v[0], v[1], v[2]], [v[0], v[2], v[3]]])


def _mesh_triangles(model: mujoco.MjModel, mesh: int) -> np.ndarray:
    va, vn = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
    fa, fn = model.mesh_faceadr[mesh], model.mesh_facenum[mesh]
    return model.mesh_vert[va:va + vn][model.mesh_face[fa:fa + fn]]


def scene_triangles(model: mujoco.MjModel, max_faces: int = 1000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tri [T, 3, 3], tri_geom [T], tri_rgb [T, 3])`` of the model's visible geometry (see the module's note)."""
    tris, geoms, colours = [], [], []

    def add(g: int, t: np.ndarray, rgb) -> None:
        tris.append(t)
        geoms.append(np.full(len(t), g))
        colours.append(np.tile(np.asarray(rgb)[None, :3], (len(t), 1)))

    for g in range(model.ngeom):
        if model.geom_group[g] > 2 or model.geom_rgba[g, 3] <= 0:
            continue
        kind = model.geom_type[g]
        rgb = model.geom_rgba[g, :3] if model.geom_matid[g] < 0 else model.mat_rgba[model.geom_matid[g], :3]
        if kind == mujoco.mjtGeom.mjGEOM_BOX:
            add(g, _box_triangles(model.geom_size[g]), rgb)
        elif kind == mujoco.mjtGeom.mjGEOM_PLANE:
            add(g, _plane_triangles(model.geom_size[g]), rgb)
        elif kind == mujoco.mjtGeom.mjGEOM_MESH:
            mesh = model.geom_dataid[g]
            if model.mesh_facenum[mesh] <= max_faces:
                add(g, _mesh_triangles(model, mesh), rgb)
                continue
            body = model.geom_bodyid[g]  # a detailed visual mesh: its body's collision meshes, in its colour
            for c in np.flatnonzero((model.geom_bodyid == body) & (model.geom_group == 3) &
                                    (model.geom_type == mujoco.mjtGeom.mjGEOM_MESH)):
                add(int(c), _mesh_triangles(model, model.geom_dataid[c]), rgb)
        # spheres, capsules, cylinders, ellipsoids: not drawn (the tabletop scenes have none visible)
    if not tris:
        raise UserError("the model has no visible box, plane or mesh to draw")
    return (np.concatenate(tris).astype(np.float32), np.concatenate(geoms).astype(np.int32),
            np.concatenate(colours).astype(np.float32))


class BatchRenderer:
    """``render(sim) -> uint8 [N, C, H, W, 3]`` (and the geom seen at every pixel, ``segment``) of the named
    model cameras, for every env of ``sim`` (a ``MujocoBatch``)."""

    FIELDS = ("geom_xpos", "geom_xmat", "cam_xpos", "cam_xmat", "light_xpos", "light_xdir")

    def __init__(self, sim, cameras, height: int, width: int | None = None, max_faces: int = 1000,
                 background=(0.0, 0.0, 0.0)):
        model = self.model = sim.model
        # the batch copies out only the derived fields bound before its last forward: bind them, then forward
        for name in self.FIELDS:
            sim.t(name)
        sim.batch.forward()
        self.height, self.width = int(height), int(width or height)
        try:
            self.cam_ids = np.array([model.camera(c).id for c in cameras])
        except KeyError as e:
            raise UserError(f"no camera {e} in the model") from None
        self.cameras = tuple(cameras)
        self.tri, self.tri_geom, self.tri_rgb = scene_triangles(model, max_faces)
        self.fy = (0.5 * self.height / np.tan(np.radians(model.cam_fovy[self.cam_ids]) / 2)).astype(np.float32)
        h = model.vis.headlight
        head = np.concatenate([[0, 0, -1], h.diffuse, [h.specular[0]]]).astype(np.float32) if h.active \
            else np.zeros(7, np.float32)
        self.head = np.tile(head, (len(self.cam_ids), 1))
        self.ambient = np.float32((h.ambient[0] if h.active else 0.0) + model.light_ambient[:, 0].sum())
        self.background = np.asarray(background, np.float32)

    def lights(self, data_light_xpos: np.ndarray, data_light_xdir: np.ndarray) -> np.ndarray:
        m = self.model
        out = np.zeros((m.nlight, 14), np.float32)
        for i in range(m.nlight):
            out[i, 0:3], out[i, 3:6] = data_light_xpos[i], data_light_xdir[i]
            out[i, 6:9], out[i, 9] = m.light_diffuse[i], m.light_specular[i, 0]
            out[i, 10] = float(m.light_type[i] == mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
            out[i, 11] = math.cos(math.radians(m.light_cutoff[i]))
            out[i, 12], out[i, 13] = m.light_exponent[i], float(m.light_active[i])
        return out

    def render(self, sim, env_ids=None, segment: bool = False, reference: bool = False):
        """Images of the envs ``env_ids`` (all when None) of ``sim`` (a ``MujocoBatch``), in its current state (as
        of its last ``forward``): ``uint8 [K, C, H, W, 3]``, and ``int32 [K, C, H, W]`` geom indices with
        ``segment``. ``reference``: the plain-torch reference instead of the kernel (slow; for tests)."""
        if reference:
            from embodied.sim_backends.mujoco_cpu.raster_reference import render
        else:
            from embodied.kernels.mesh_raster_numba import render

        def pick(name):
            x = sim.t(name)
            return (x if env_ids is None else x[env_ids]).numpy()

        geom_pos = np.ascontiguousarray(pick("geom_xpos"), np.float32)
        geom_mat = np.ascontiguousarray(pick("geom_xmat"), np.float32)
        cam_pos = np.ascontiguousarray(pick("cam_xpos")[:, self.cam_ids], np.float32)
        cam_mat = np.ascontiguousarray(pick("cam_xmat")[:, self.cam_ids], np.float32)
        lights = self.lights(sim.t("light_xpos")[0].numpy(), sim.t("light_xdir")[0].numpy())  # static lights
        k = geom_pos.shape[0]
        image = np.empty((k, len(self.cam_ids), self.height, self.width, 3), np.uint8)
        seg = np.empty((k, len(self.cam_ids), self.height, self.width), np.int32)
        render(self.tri, self.tri_geom, self.tri_rgb, geom_pos, geom_mat, cam_pos, cam_mat, self.fy, lights,
               self.head, self.ambient, np.float32(SPEC), np.float32(SHININESS), self.background, image, seg)
        return (torch.from_numpy(image), torch.from_numpy(seg)) if segment else torch.from_numpy(image)


def mujoco_reference(model: mujoco.MjModel, qpos: np.ndarray, camera: str, height: int, width: int | None = None,
                     fast: bool = True, segment: bool = False, mocap_pos: np.ndarray | None = None) -> np.ndarray:
    """MuJoCo's own image of the model at ``qpos`` through ``camera``: ``fast`` in the configuration the batched
    renderer reproduces (no shadows, no reflections, no multisampling), else MuJoCo's defaults; with ``segment``
    the geom index per pixel (-1: none)."""
    from embodied.sim_backends.mujoco_cpu.render import _gl_context

    width = width or height
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    if mocap_pos is not None:
        data.mocap_pos[:] = mocap_pos
    mujoco.mj_forward(model, data)
    offsamples = model.vis.quality.offsamples
    if fast:
        model.vis.quality.offsamples = 0
    ctx = _gl_context(width, height)  # made here (EGL/OSMesa), not by mujoco.Renderer (which asks GLFW first)
    try:
        scene, option, cam = mujoco.MjvScene(model, maxgeom=10_000), mujoco.MjvOption(), mujoco.MjvCamera()
        cam.type, cam.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, model.camera(camera).id
        context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, context)
        mujoco.mjv_updateScene(model, data, option, None, cam, mujoco.mjtCatBit.mjCAT_ALL, scene)
        if fast:
            scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        if segment:
            scene.flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = 1
            scene.flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = 1
        viewport = mujoco.MjrRect(0, 0, width, height)
        mujoco.mjr_render(viewport, scene, context)
        rgb = np.empty((height, width, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(rgb, None, viewport, context)
        rgb = rgb[::-1]
        if segment:  # the scene's geom index + 1 in the colour channels (as mujoco.Renderer decodes it)
            idx = rgb[..., 0].astype(np.int64) + (rgb[..., 1].astype(np.int64) << 8) + \
                (rgb[..., 2].astype(np.int64) << 16) - 1
            lookup = np.full(scene.ngeom + 1, -1, np.int64)
            for k in range(scene.ngeom):
                if scene.geoms[k].objtype == mujoco.mjtObj.mjOBJ_GEOM:
                    lookup[k] = scene.geoms[k].objid
            out = np.where((idx >= 0) & (idx < scene.ngeom), lookup[np.clip(idx, 0, scene.ngeom)], -1)
        else:
            out = np.ascontiguousarray(rgb)
        context.free()
    finally:
        model.vis.quality.offsamples = offsamples
        ctx.free()
    return out
