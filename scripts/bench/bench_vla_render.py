"""Camera images per second for a batch of mini-libero envs (issue 13): our batched renderer
(``kernels/mesh_raster_numba.py``, both cameras of every env in one call) against MuJoCo's own renderer (one
``mjr_render`` per env and camera, on the machine's offscreen GL) in the same run, at 64x64 and 96x96. Both cameras
are counted (agentview and wrist). MuJoCo is timed in its default configuration (shadows, reflections, 4x
multisampling) and in the configuration our renderer reproduces (none of them): the speed-up is reported against
both. Image agreement with MuJoCo (PSNR, silhouette IoU per object) is checked in ``tests/kernels/test_mesh_raster.py``.

    python scripts/bench/bench_vla_render.py [--envs 64] [--sizes 64 96] [--out bench_results/vla_render.json]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info, rate  # noqa: E402

CAMERAS = ("agentview", "wrist")


def mujoco_rate(model, states, size: int, fast: bool, seconds: float) -> float:
    """Images per second of MuJoCo's renderer over ``states`` (qpos, mocap_pos) and both cameras."""
    import mujoco
    import numpy as np

    from embodied.sim_backends.mujoco_cpu.render import _gl_context

    offsamples = model.vis.quality.offsamples
    if fast:
        model.vis.quality.offsamples = 0
    ctx = _gl_context(size, size)
    data = mujoco.MjData(model)
    scene, option = mujoco.MjvScene(model, maxgeom=10_000), mujoco.MjvOption()
    context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
    mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, context)
    viewport = mujoco.MjrRect(0, 0, size, size)
    cams = []
    for name in CAMERAS:
        cam = mujoco.MjvCamera()
        cam.type, cam.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, model.camera(name).id
        cams.append(cam)
    rgb = np.empty((size, size, 3), np.uint8)

    def one_batch():
        for qpos, mocap in states:
            data.qpos[:], data.mocap_pos[:] = qpos, mocap
            mujoco.mj_forward(model, data)
            for cam in cams:
                mujoco.mjv_updateScene(model, data, option, None, cam, mujoco.mjtCatBit.mjCAT_ALL, scene)
                if fast:
                    scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
                    scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
                mujoco.mjr_render(viewport, scene, context)
                mujoco.mjr_readPixels(rgb, None, viewport, context)

    try:
        t0 = time.perf_counter()
        one_batch()  # warm-up, and the time of one batch decides how many to run
        once = time.perf_counter() - t0
        calls = max(1, int(seconds / max(once, 1e-6)))
        t0 = time.perf_counter()
        for _ in range(calls):
            one_batch()
        return calls * len(states) * len(CAMERAS) / (time.perf_counter() - t0)
    finally:
        context.free()
        ctx.free()
        model.vis.quality.offsamples = offsamples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--sizes", type=int, nargs="*", default=[64, 96])
    ap.add_argument("--mujoco-envs", type=int, default=8, help="states MuJoCo's renderer draws (it is slow)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default="bench_results/vla_render.json")
    args = ap.parse_args()
    import numba
    import torch

    import embodied
    from embodied.sim_backends.mujoco_cpu.batch_render import BatchRenderer

    torch.set_num_threads(1)
    env = embodied.make_env("mini-libero", num_envs=args.envs, seed=0)
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):  # the arms off their home pose
        env.step(torch.rand(args.envs, 7, generator=g) * 2 - 1)
    k = min(args.mujoco_envs, args.envs)
    states = [(env.sim.qpos[i].numpy().copy(), env.sim.t("mocap_pos")[i].numpy().copy()) for i in range(k)]
    rows = []
    for size in args.sizes:
        r = BatchRenderer(env.sim, CAMERAS, size)
        ours = rate(lambda r=r: r.render(env.sim), args.envs * len(CAMERAS), args.seconds)
        fast = mujoco_rate(env.sim.model, states, size, True, args.seconds)
        default = mujoco_rate(env.sim.model, states, size, False, args.seconds)
        rows.append({"size": size, "batch_envs": args.envs, "images_per_call": args.envs * len(CAMERAS),
                     "ours_images_per_s": round(ours, 1), "mujoco_default_images_per_s": round(default, 2),
                     "mujoco_fast_images_per_s": round(fast, 2),
                     "speedup_vs_mujoco_default": round(ours / default, 1),
                     "speedup_vs_mujoco_fast": round(ours / fast, 1)})
        print(rows[-1], file=sys.stderr, flush=True)
    emit({"benchmark": "vla_render", "machine": machine_info(), "numba_threads": numba.get_num_threads(),
          "triangles": int(r.tri.shape[0]), "rows": rows,
          "goal": ">= 10x MuJoCo's renderer and >= 500 images/s (aim 2000), 64 envs x 2 cameras"}, args.out)


if __name__ == "__main__":
    main()
