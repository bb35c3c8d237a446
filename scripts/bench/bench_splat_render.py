"""Gaussian-splat rendering on the CPU (issue 10): frames/s of the numba kernel vs the plain-torch reference on the
generator's default street scene, cameras on the route 1.5 m above the road looking ahead, batch of 16 cameras,
64x112 RGB; the kernel's time split (project + SH, depth sort, bin + composite) and the mean number of Gaussians
blended per pixel; 128x128 with ~100k Gaussians; and the env step as a user feels it
(``make_env("drive-lane-keep", num_envs=16)``, defaults, random actions).

    python scripts/bench/bench_splat_render.py [--out bench_results/splat_render.json]

The torch reference is timed on 2 of the 16 cameras (it is ~1000x slower) and reported per frame."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402


def _cameras(route, count: int, width: int, height: int, stride: int = 6):
    from embodied.sim_backends.splat.reference import fov_to_focal, look_at

    line = np.asarray(route.centerline)
    f = fov_to_focal(math.radians(90), width)
    views = []
    for i in range(count):
        j = 4 + i * stride
        p, q = line[j], line[j + 4]
        views.append(look_at((p[0], p[1], 1.5), (q[0], q[1], 1.5)))
    intr = np.array([[f, f, width / 2, height / 2]] * count, np.float32)
    return torch.stack(views).numpy(), intr


def _time(fn, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def kernel_case(scene, route, width: int, height: int, far: float, cams: int = 16, repeats: int = 10) -> dict:
    from embodied.kernels import splat_numba as k
    from embodied.sim_backends.splat.render import SplatScene

    s = SplatScene(scene)
    arrays = s.numba_arrays()
    views, intr = _cameras(route, cams, width, height)
    args = (*arrays, views, intr, width, height, 0.01, far, 0.005, (0.62, 0.75, 0.92))
    dt = _time(lambda: k.render_cameras(*args), repeats)
    _, _, _, stats = k.render_cameras(*args)
    # the split, one thread, camera by camera
    t_proj = t_sort = t_comp = 0.0
    for c in range(cams):
        none = (np.zeros((0, 3), np.float32), np.zeros((0, 6), np.float32), np.zeros(0, np.float32),
                np.zeros((0, arrays[3].shape[1], 3), np.float32))
        pa = (*arrays, views[c], intr[c], width, height, np.float32(0.01), np.float32(far), np.float32(0.005), 0,
              -1, *none)
        t_ps = _time(lambda: k.project_camera(*pa), 3)  # noqa: B023
        data, rect = k.project_camera(*pa)
        depth = np.ascontiguousarray(data[:, 9])
        rng = np.random.default_rng(c)
        shuffled = depth[rng.permutation(len(depth))]
        t_s = _time(lambda: k.radix_argsort(shuffled), 3)  # noqa: B023
        out = (np.empty((height, width, 3), np.float32), np.empty((height, width), np.float32),
               np.empty((height, width), np.float32))
        t_c = _time(lambda: k.raster_camera(data, rect, width, height, np.zeros(3, np.float32), *out), 3)  # noqa
        t_proj, t_sort, t_comp = t_proj + t_ps - t_s, t_sort + t_s, t_comp + t_c
    return {"width": width, "height": height, "far_m": far, "cameras": cams, "scene_gaussians": s.num,
            "visible_per_camera": float(stats[:, 0].mean()), "visible_min": int(stats[:, 0].min()),
            "blends_per_pixel": float(stats[:, 1].mean() / (width * height)),
            "kernel_ms_per_batch": 1e3 * dt, "kernel_fps": cams / dt,
            "split_ms_per_frame_1_thread": {"project_sh": 1e3 * t_proj / cams, "sort": 1e3 * t_sort / cams,
                                            "bin_composite": 1e3 * t_comp / cams}}


def reference_case(scene, route, width: int, height: int, far: float, cams: int = 2) -> dict:
    from embodied.sim_backends.splat.render import SplatScene, render_views

    s = SplatScene(scene)
    views, intr = _cameras(route, cams, width, height)
    t = time.perf_counter()
    render_views(s, torch.from_numpy(views), torch.from_numpy(intr), width, height, far=far, kernel="torch")
    dt = time.perf_counter() - t
    return {"reference_cameras": cams, "reference_s_per_frame": dt / cams, "reference_fps": cams / dt}


def env_step_case(steps: int = 100, task: str = "drive-lane-keep", **overrides) -> dict:
    import embodied

    t0 = time.perf_counter()
    env = embodied.make_env(task, num_envs=16, seed=0, **overrides)
    env.reset(seed=0)
    build = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    act = lambda: torch.rand(16, 2, generator=g) * 2 - 1  # noqa: E731
    for _ in range(5):
        env.step(act())
    t = time.perf_counter()
    for _ in range(steps):
        env.step(act())
    dt = time.perf_counter() - t
    return {"task": task, "overrides": overrides, "num_envs": 16, "steps": steps, "env_steps_per_s": 16 * steps / dt,
            "build_s": build}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from embodied.sim_backends.splat.procedural import RoadSceneConfig, generate

    torch.set_num_threads(2)
    scene, route = generate(1)
    out = {"bench": "splat_render", "machine": machine_info(), "numba_threads": __import__("numba").get_num_threads()}
    cases = []
    for far in (30.0, 60.0):
        case = kernel_case(scene, route, 112, 64, far)
        case.update(reference_case(scene, route, 112, 64, far))
        case["kernel_over_reference"] = case["kernel_fps"] / case["reference_fps"]
        cases.append(case)
    big, big_route = generate(1, RoadSceneConfig(spacing=0.08, verge_spacing=0.2, crown_points=300))
    cases.append(kernel_case(big, big_route, 128, 128, 100.0))
    out["cases"] = cases
    out["env_step"] = env_step_case()
    out["env_step_more"] = [env_step_case(task="drive-avoid"), env_step_case(probing=True),
                            env_step_case(observation="state")]
    emit(out, args.out)


if __name__ == "__main__":
    main()
