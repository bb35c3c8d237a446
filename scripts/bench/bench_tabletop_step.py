"""Stepping throughput of the Franka tabletop (issue 12): env-steps/s and simulated seconds per second of
``embodied.make_env(task, num_envs=N, sim_threads=T)`` with random LIBERO actions (controller, observations,
rewards and autoreset included), against

- ``mujoco.rollout`` on the same MJCF, open loop, the same substeps per control step on T threads: the ceiling
  (physics only: no controller, observation, reward or Python per step);
- gymnasium-robotics ``FetchPickAndPlace-v4`` vectorized at the same N (best of gymnasium's sync and async
  vector envs), on the same MuJoCo: the MuJoCo manipulation env a user would reach for today. gymnasium-robotics
  1.4.2 does not start on MuJoCo >= 3.17 (its joint setters compare ``model.jnt_type`` entries, numpy ints, with
  ``mujoco.mjtJoint`` members, which no longer compare equal to ints); the benchmark gives its ``mujoco_utils``
  the joint-type constants as ints, which touches its reset helpers only, not its step. It runs in a subprocess.

Prints one JSON with the ratios (ours / Fetch in simulated s/s, ours / ceiling).

    python scripts/bench/bench_tabletop_step.py [--tasks pick-place peg-insert] [--sizes 16 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, exit_on_sigterm, machine_info  # noqa: E402
from _machine import rate as _rate  # noqa: E402

FETCH = r"""
import json, sys, types
import gymnasium as gym, gymnasium_robotics, mujoco, numpy as np
import gymnasium_robotics.utils.mujoco_utils as mu
sys.path.insert(0, sys.argv[3])
from _machine import rate

class _Mujoco:  # mujoco with the joint-type constants as ints (see the docstring)
    mjtJoint = types.SimpleNamespace(**{k: int(getattr(mujoco.mjtJoint, k))
                                        for k in ("mjJNT_FREE", "mjJNT_BALL", "mjJNT_SLIDE", "mjJNT_HINGE")})
    def __getattr__(self, k):
        return getattr(mujoco, k)

mu.mujoco = _Mujoco()
gym.register_envs(gymnasium_robotics)
n, seconds = int(sys.argv[1]), float(sys.argv[2])
out = {}
for mode in ("sync", "async"):
    env = gym.make_vec("FetchPickAndPlace-v4", num_envs=n, vectorization_mode=mode)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    act = lambda: rng.uniform(-1, 1, (n, 4)).astype(np.float32)
    out[mode] = rate(lambda: env.step(act()), n, seconds)
    dt = env.get_attr("dt")[0] if hasattr(env, "get_attr") else env.unwrapped.dt
    env.close()
out["dt"] = float(dt)
print(json.dumps(out))
"""


def ours(task: str, n: int, threads: int, seconds: float) -> tuple[float, float]:
    import embodied

    env = embodied.make_env(task, num_envs=n, seed=0, sim_threads=threads)
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    rate = _rate(lambda: env.step(torch.rand(n, 7, generator=g) * 2 - 1), n, seconds)
    return rate, env.control_dt


def ceiling(task: str, n: int, threads: int, seconds: float) -> float:
    """Control steps/s of ``mujoco.rollout`` on the task's model: ``frame_skip`` substeps per control step."""
    import mujoco
    from mujoco import rollout

    import embodied

    env = embodied.make_env(task, num_envs=1, seed=0)
    model, skip = env.sim.model, env.sim.frame_skip
    env.reset(seed=0)
    state0 = np.zeros(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
    data = mujoco.MjData(model)
    data.qpos[:] = env.sim.qpos[0].numpy()
    mujoco.mj_forward(model, data)
    mujoco.mj_getState(model, data, state0, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    steps = 20  # control steps per call
    control = np.tile(env.sim.ctrl[0].numpy(), (n, steps * skip, 1))
    initial = np.tile(state0, (n, 1))
    datas = [mujoco.MjData(model) for _ in range(threads)]
    with rollout.Rollout(nthread=threads) as r:
        call = lambda: r.rollout([model] * n, datas, initial, control)  # noqa: E731
        return _rate(call, n * steps, seconds)


def fetch(n: int, seconds: float) -> dict | str:
    proc = subprocess.run([sys.executable, "-c", FETCH, str(n), str(seconds), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        return f"failed: {proc.stderr.strip().splitlines()[-1:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="*", default=["pick-place"])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 64])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n in args.sizes:
        peer = fetch(n, args.seconds)
        for task in args.tasks:
            rate, dt = ours(task, n, args.threads, args.seconds)
            ceil = ceiling(task, n, args.threads, args.seconds)
            row = {"task": task, "num_envs": n, "threads": args.threads, "control_dt": dt,
                   "env_steps_per_s": round(rate, 1), "sim_s_per_s": round(rate * dt, 2),
                   "ceiling_env_steps_per_s": round(ceil, 1), "vs_ceiling": round(rate / ceil, 3)}
            if isinstance(peer, dict):
                best = max(peer["sync"], peer["async"])
                row.update(fetch_env_steps_per_s={k: round(peer[k], 1) for k in ("sync", "async")},
                           fetch_dt=peer["dt"], fetch_sim_s_per_s=round(best * peer["dt"], 2),
                           vs_fetch_sim_s_per_s=round(rate * dt / (best * peer["dt"]), 3))
            else:
                row["fetch"] = peer
            rows.append(row)
    emit({"bench": "tabletop_step", "machine": machine_info(), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
