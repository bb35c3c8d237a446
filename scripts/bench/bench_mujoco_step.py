"""Stepping throughput of the MuJoCo locomotion tasks: env-steps/s with random actions and autoreset,
through the public ``embodied.make_env(task, num_envs=N, sim_threads=T).step(torch_action)``, against
EnvPool (best of its sync and async modes), gymnasium's Sync/AsyncVectorEnv, and ``mujoco.rollout``
open-loop (the ceiling: physics only, no observation, reward or Python per step). Prints one JSON.

    python scripts/bench/bench_mujoco_step.py [--tasks halfcheetah ant] [--sizes 8 16 64 256] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import mujoco
import numpy as np
import torch
from _machine import machine_info  # scripts/bench is on sys.path when a bench runs
from _machine import rate as _rate

import embodied
from embodied.tasks.locomotion.mujoco_v5 import TASKS_V5


def ours(task: str, n: int, threads: int, seconds: float) -> float:
    env = embodied.make_env(task, num_envs=n, seed=0, sim_threads=threads)
    env.reset(seed=0)
    low, high = env.single_action_space.low, env.single_action_space.high
    g = torch.Generator().manual_seed(0)
    lo, span = torch.from_numpy(low), torch.from_numpy(high - low)
    return _rate(lambda: env.step(lo + span * torch.rand(n, low.size, generator=g)), n, seconds)


def envpool_best(gym_id: str, n: int, threads: int, seconds: float) -> dict:
    import envpool

    out = {}
    env = envpool.make_gymnasium(gym_id, num_envs=n, num_threads=threads, seed=0)
    env.reset()
    act = env.action_space
    rng = np.random.default_rng(0)
    out["sync"] = _rate(lambda: env.step(rng.uniform(act.low, act.high, (n, *act.shape)).astype(np.float32)), n,
                        seconds)
    env.close()
    if n >= 2 * threads:  # async: step half the envs while the other half are in flight
        batch = n // 2
        env = envpool.make_gymnasium(gym_id, num_envs=n, batch_size=batch, num_threads=threads, seed=0)
        env.async_reset()

        def step():
            _, _, _, _, info = env.recv()
            env.send(rng.uniform(act.low, act.high, (batch, *act.shape)).astype(np.float32), info["env_id"])

        out["async"] = _rate(step, batch, seconds)
        env.close()
    out["best"] = max(out.values())
    return out


def gym_vector(gym_id: str, n: int, workers: int, seconds: float, asynchronous: bool) -> float:
    if asynchronous:
        envs = gym.vector.AsyncVectorEnv([lambda: gym.make(gym_id)] * n, shared_memory=True,
                                         context="fork") if workers > 1 else None
        if envs is None:
            return float("nan")
    else:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(gym_id)] * n)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    rate = _rate(lambda: envs.step(envs.action_space.sample()), n, seconds)
    envs.close()
    return rate


def rollout_ceiling(task: str, n: int, threads: int, seconds: float) -> float:
    """Open-loop ``mujoco.rollout`` of ``n`` worlds, ``frame_skip`` substeps per env-step."""
    from mujoco import rollout

    env = embodied.make_env(task, num_envs=1, seed=0)
    model, skip = env.sim.model, env.cfg.frame_skip
    horizon = 20  # env-steps per rollout call
    datas = [mujoco.MjData(model) for _ in range(threads)]
    state = np.zeros(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
    mujoco.mj_getState(model, datas[0], state, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    init = np.tile(state, (n, 1))
    rng = np.random.default_rng(0)
    lo, hi = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    ctrl = rng.uniform(lo, hi, (n, horizon * skip, model.nu))
    with rollout.Rollout(nthread=threads) as r:
        return _rate(lambda: r.rollout(model, datas, init, ctrl), n * horizon, seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", nargs="+", default=["halfcheetah", "ant"])
    p.add_argument("--sizes", nargs="+", type=int, default=[8, 16, 64, 256])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--no-gym", action="store_true", help="skip gymnasium's vector envs (slowest peers)")
    args = p.parse_args()
    torch.set_num_threads(1)
    import envpool

    result = {**machine_info(), "envpool": envpool.__version__, "gymnasium": gym.__version__,
              "unit": "env-steps/s", "rows": []}
    for task in args.tasks:
        gym_id = TASKS_V5[task][1]
        for threads in args.threads:
            for n in args.sizes:
                row = {"task": task, "num_envs": n, "threads": threads}
                row["ours"] = ours(task, n, threads, args.seconds)
                row["envpool"] = envpool_best(gym_id, n, threads, args.seconds)
                row["rollout_open_loop"] = rollout_ceiling(task, n, threads, args.seconds)
                if not args.no_gym:
                    row["gym_sync"] = gym_vector(gym_id, n, threads, args.seconds, asynchronous=False)
                    if threads > 1 and n <= 64:  # one process per env: 256 processes do not fit in memory here
                        row["gym_async"] = gym_vector(gym_id, n, threads, args.seconds, asynchronous=True)
                row["ratio_vs_envpool"] = row["ours"] / row["envpool"]["best"]
                row["ratio_vs_ceiling"] = row["ours"] / row["rollout_open_loop"]
                row["overhead_us_per_step"] = 1e6 / row["ours"] - 1e6 / row["rollout_open_loop"]
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
