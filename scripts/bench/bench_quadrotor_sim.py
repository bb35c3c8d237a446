"""Quadrotor simulation speed, ours vs the ``l2f`` peer, single thread; prints one JSON object.

Measured, in ns per env-step (median over repetitions), for N in 1, 64, 1024, 16384:
  ours  sim_numba   ``QuadrotorSim.step`` with the numba kernel (the CPU default)
        sim_torch   ``QuadrotorSim.step`` with the plain-torch reference kernel
        task_step   ``make_env("quadrotor-hover", num_envs=N).step(action)``: physics, reward
                    terms, termination, truncation, same-step reset with final_obs, observations
                    (on CPU the fused numba kernel, kernels/quadrotor_numba.py)
        task_step_torch  the same with ``kernel=torch`` (the tensor reference, the CUDA path)
  l2f   step        ``V.step`` alone (RLtools L2F C++ simulator bindings, PyPI ``l2f``)
        full_loop   step, reward, terminated, time limit, final observe where some env is done,
                    reset-if-done (parameters and state), observe: like for like with task_step

Usage: ``python scripts/bench/bench_quadrotor_sim.py [--quick]`` (``--quick``: tiny sizes and
budgets, for the smoke test; its numbers mean nothing). See ../shared/reference/quadrotor.md 1.6, 7.
"""

from __future__ import annotations

import os

# single thread everywhere; must be set before torch, numba or l2f (OpenMP) are imported
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import NamedTuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import embodied  # noqa: E402
from embodied.core.rotations import quat_from_axis_angle, random_unit_vectors  # noqa: E402
from embodied.sim_backends.torch_vec.quadrotor import QuadrotorParams, QuadrotorSim  # noqa: E402

SIZES = (1, 64, 1024, 16384)
QUICK_SIZES = (1, 64)
L2F_HOVER_THROTTLE = 0.726  # l2f Crazyflie parameters (reference 1.2): action 2 * 0.726 - 1


class Timing(NamedTuple):
    """Median seconds per call: CPU time of the calling thread (robust to other processes on the
    shared cores; every measured library runs single-threaded in this thread) and wall clock."""

    cpu_s: float
    wall_s: float


def time_per_call(fn: Callable[[], object], target_s: float, reps: int) -> Timing:
    """Time ``fn`` over ``reps`` repetitions of about ``target_s`` each; medians per call."""
    fn()  # warm-up (numba compile, caches, allocator)
    calls, elapsed = 1, 0.0
    while elapsed < target_s / 10:  # calibrate the number of calls per repetition
        calls *= 2
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - t0
    calls = max(1, round(calls * target_s / elapsed))
    cpu, wall = [], []
    for _ in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            fn()
        wall.append((time.perf_counter() - t0) / calls)
        cpu.append((time.thread_time() - c0) / calls)
    return Timing(statistics.median(cpu), statistics.median(wall))


class Table:
    """``{name: {str(N): ns per env-step}}`` for CPU time, and the same for wall clock."""

    def __init__(self):
        self.cpu: dict[str, dict[str, float | None]] = {}
        self.wall: dict[str, dict[str, float | None]] = {}

    def add(self, name: str, n: int, timing: Timing | None) -> None:
        self.cpu.setdefault(name, {})[str(n)] = None if timing is None else 1e9 * timing.cpu_s / n
        self.wall.setdefault(name, {})[str(n)] = None if timing is None else 1e9 * timing.wall_s / n


# ---- ours ---------------------------------------------------------------------------------------
def bench_sim(n: int, kernel: str, target_s: float, reps: int) -> Timing:
    """Time per call of ``QuadrotorSim.step``. Motors at and commanded to hover rpm, no
    disturbance, small random tilt and spin: thrust balances weight, the angular velocity is
    conserved, so however many calls the timing makes, the state stays finite and normal (no
    NaN or denormal slow paths)."""
    params = QuadrotorParams()
    sim = QuadrotorSim(n, "cpu", params, kernel=kernel)
    g = torch.Generator().manual_seed(0)
    x0 = sim.x.clone()
    x0[:, 0:3] = torch.rand(n, 3, generator=g) * 0.4 - 0.2
    x0[:, 3:7] = quat_from_axis_angle(random_unit_vectors(n, g, "cpu"), torch.rand(n, generator=g) * 0.2)
    x0[:, 10:13] = torch.rand(n, 3, generator=g) - 0.5
    x0[:, 13:17] = params.hover_rpm
    sim.x.copy_(x0)
    controls = torch.full((n, 4), params.hover_rpm)

    def step():
        sim.step(controls)

    return time_per_call(step, target_s, reps)


def bench_task(n: int, target_s: float, reps: int, kernel: str = "auto", count_steps: int = 20_000
               ) -> tuple[Timing, float | None]:
    """Time per call of the full task step, and the fraction of env-steps that ended an episode (over
    ``count_steps`` env-steps after the timing; 0: not counted)."""
    env = embodied.make_env("quadrotor-hover", num_envs=n, seed=0, kernel=kernel)
    env.reset()
    g = torch.Generator().manual_seed(0)
    action = (env.hover_action + 0.05 * torch.randn(n, 4, generator=g)).clamp(-1, 1)

    def step():  # the public call alone, as a user's loop makes it
        env.step(action)

    timing = time_per_call(step, target_s, reps)
    if not count_steps:
        return timing, None
    done = total = 0
    for _ in range(max(1, count_steps // n)):  # the episode-end rate under this action, outside the timing
        _, _, terminated, truncated, _ = env.step(action)
        done += int((terminated | truncated).sum())
        total += n
    return timing, done / total


# ---- l2f ----------------------------------------------------------------------------------------
class L2FBatch:
    """``total`` envs as one or more fixed-size l2f vectors (the bindings are templated on N)."""

    def __init__(self, l2f, total: int, seed: int = 0):
        sizes = sorted(l2f.vector_selector)
        size = total if total in l2f.vector_selector else max(s for s in sizes if s <= total)
        if total % size:
            raise ValueError(f"{total} envs cannot be split into l2f vectors of {size}")
        self.layout = f"vector{size}" if size == total else f"{total // size} x vector{size}"
        self.dev = l2f.Device()
        self.parts = [_L2FVector(l2f.vector_selector[size], self.dev, seed + i * size) for i in range(total // size)]

    def step(self):
        for part in self.parts:
            part.step(self.dev)

    def full_loop(self):
        for part in self.parts:
            part.full_loop(self.dev)

    def done_fraction(self) -> float:
        return sum(p.done_count for p in self.parts) / max(1, sum(p.step_count for p in self.parts))


class _L2FVector:
    def __init__(self, vec, dev, seed: int):
        self.v = vec
        self.rng = vec.VectorRng()
        vec.initialize_rng(dev, self.rng, seed)
        self.envs = vec.VectorEnvironment()
        vec.initialize_environment(dev, self.envs)
        self.params = vec.VectorParameters()
        self.state, self.next_state = vec.VectorState(), vec.VectorState()
        vec.sample_initial_parameters(dev, self.envs, self.params, self.rng)
        vec.sample_initial_state(dev, self.envs, self.params, self.state, self.rng)
        n = self.envs.N_ENVIRONMENTS
        self.limit = self.envs.EPISODE_STEP_LIMIT
        rs = np.random.default_rng(seed)
        action = 2 * L2F_HOVER_THROTTLE - 1 + 0.05 * rs.standard_normal((n, self.envs.ACTION_DIM))
        self.action = np.ascontiguousarray(action.clip(-1, 1), dtype=np.float32)
        self.obs = np.empty((n, self.envs.OBSERVATION_DIM), np.float32)
        self.final_obs = np.empty_like(self.obs)
        self.reward = np.empty(n, np.float32)
        self.terminated = np.empty(n, bool)
        self.episode_step = np.zeros(n, np.int64)
        self.done_count = self.step_count = 0
        self.counting = False

    def step(self, dev):
        # re-steps the same state (next_state is overwritten): values do not change the RK4 cost
        self.v.step(dev, self.envs, self.params, self.state, self.action, self.next_state, self.rng)

    def full_loop(self, dev):
        v, envs, params, rng = self.v, self.envs, self.params, self.rng
        v.step(dev, envs, params, self.state, self.action, self.next_state, rng)
        v.reward(dev, envs, params, self.state, self.action, self.next_state, self.reward, rng)
        v.terminated(dev, envs, params, self.next_state, self.terminated, rng)
        self.episode_step += 1
        done = self.terminated | (self.episode_step >= self.limit)
        if done.any():
            v.observe(dev, envs, params, self.next_state, self.final_obs, rng)  # for bootstrapping
            self.episode_step[done] = 0
            v.sample_initial_parameters_if_truncated(dev, envs, params, done, rng)
            v.sample_initial_state_if_truncated(dev, envs, params, self.next_state, done, rng)
        v.observe(dev, envs, params, self.next_state, self.obs, rng)
        self.state, self.next_state = self.next_state, self.state  # swap instead of copying
        if self.counting:  # bookkeeping of the bench, off while timed (as for ours)
            self.done_count += int(done.sum())
            self.step_count += done.size


def bench_l2f(sizes, target_s: float, reps: int) -> tuple[dict, Table]:
    table = Table()
    try:
        import l2f
    except Exception as e:  # any import failure (missing, broken build) means: peer unavailable
        return {"available": False, "reason": f"import l2f failed: {type(e).__name__}: {e}"}, table
    info = {
        "available": True,
        "version": _version("l2f"),
        "supported_vector_sizes": sorted(l2f.vector_selector),
        "layout": {},
        "done_fraction": {},
    }
    for n in sizes:
        key = str(n)
        try:
            batch = L2FBatch(l2f, n)
        except ValueError as e:
            info["layout"][key] = f"unsupported: {e}"
            table.add("step", n, None)
            table.add("full_loop", n, None)
            continue
        info["layout"][key] = batch.layout
        table.add("step", n, time_per_call(batch.step, target_s, reps))
        table.add("full_loop", n, time_per_call(batch.full_loop, target_s, reps))
        for part in batch.parts:
            part.counting = True
        for _ in range(max(1, 20_000 // n)):
            batch.full_loop()
        info["done_fraction"][key] = batch.done_fraction()
    return info, table


# ---- report -------------------------------------------------------------------------------------
def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    sizes = QUICK_SIZES if quick else SIZES
    target_s, reps = (0.01, 2) if quick else (0.3, 7)
    t_start = time.perf_counter()
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    ours, done_fraction = Table(), {}
    for n in sizes:
        ours.add("sim_numba", n, bench_sim(n, "numba", target_s, reps))
        ours.add("sim_torch", n, bench_sim(n, "torch", target_s, reps))
        timing, done_fraction[str(n)] = bench_task(n, target_s, reps)
        ours.add("task_step", n, timing)
        ours.add("task_step_torch", n, bench_task(n, target_s, reps, kernel="torch", count_steps=0)[0])
    peer, peer_table = bench_l2f(sizes, target_s, reps)
    l2f = None
    if peer["available"]:
        l2f = {k: v for k, v in peer.items() if k != "available"} | peer_table.cpu
    step = peer_table.cpu.get("step", {})
    loop = peer_table.cpu.get("full_loop", {})
    ratios = {
        "sim_numba_over_l2f_step": {k: _ratio(v, step.get(k)) for k, v in ours.cpu["sim_numba"].items()},
        "sim_torch_over_l2f_step": {k: _ratio(v, step.get(k)) for k, v in ours.cpu["sim_torch"].items()},
        "task_step_over_l2f_full_loop": {k: _ratio(v, loop.get(k)) for k, v in ours.cpu["task_step"].items()},
        "task_step_torch_over_l2f_full_loop": {k: _ratio(v, loop.get(k))
                                               for k, v in ours.cpu["task_step_torch"].items()},
    }
    # at N = 1 the time per call is almost all fixed per-call cost (Python, dispatch, allocation)
    per_call = {name: ours.cpu[name]["1"] / 1e3 for name in ("sim_numba", "sim_torch", "task_step",
                                                               "task_step_torch")}
    if l2f is not None:
        per_call["l2f_step"] = step["1"] / 1e3 if step.get("1") is not None else None
        per_call["l2f_full_loop"] = loop["1"] / 1e3 if loop.get("1") is not None else None
    return {
        "benchmark": "quadrotor_sim",
        "unit": "ns per env-step of thread CPU time, median over repetitions; 1 thread",
        "quick": quick,
        "sizes": list(sizes),
        "repetitions": reps,
        "seconds_per_repetition": target_s,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numba": _version("numba"),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            # the cores are shared: a load above ~0 at the start means other work competed
            "loadavg_1min_at_start": load_at_start,
        },
        "ours": ours.cpu | {"task_done_fraction": done_fraction},
        "l2f": l2f,
        "wall_clock_ns": {"ours": ours.wall, "l2f": peer_table.wall or None},
        "l2f_unavailable_reason": None if l2f is not None else peer["reason"],
        "ratio_ours_over_l2f": ratios,
        "per_call_us_at_N1": per_call,
        "notes": {
            "task_step_torch": "the same step on the tensor reference path (kernel=torch; the CUDA path)",
            "task_step": "make_env('quadrotor-hover').step (the default, on CPU one fused numba kernel: "
            "kernels/quadrotor_numba.py): physics + reward terms + termination + "
            "truncation + same-step reset with final_obs + actor (82: 18 + 16 x 4 past actions) and critic (28) "
            "observations",
            "l2f_full_loop": "step + reward + terminated + time limit + observe(final) when any done + "
            "reset params/state if done + observe (82-dim); state buffers swapped, not copied",
            "l2f_layout": "l2f is compiled for vector sizes 1..8192 only; N = 16384 runs 2 x vector8192",
            "done_fraction": "episodes ended per env-step under the fixed near-hover action used here",
            "clock": "tables and ratios use the calling thread's CPU time (the 2 cores are shared); "
            "wall_clock_ns has the same measurements in wall-clock time",
            "parameters": "ours: Crazyflie 2.1 learning-to-fly set; l2f: its newer Crazyflie set "
            "(reference 1.2), so the dynamics differ slightly; cost per step is what is compared",
        },
        "wall_s": time.perf_counter() - t_start,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and budgets (smoke test)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
