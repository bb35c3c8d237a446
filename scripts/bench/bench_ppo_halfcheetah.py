"""End-to-end PPO on HalfCheetah: process wall-clock of ``embodied train --task halfcheetah
total_steps=N`` (task defaults: evaluations, checkpoints and the plot included) against
Stable-Baselines3 ``PPO("MlpPolicy")`` with its defaults on ``make_vec_env("HalfCheetah-v5", 8,
vec_env_cls=SubprocVecEnv)`` (and DummyVecEnv), same budget, in the same run. Return: 10 deterministic
evaluation episodes. Resumable: one JSON per (variant, seed) under --out; finished ones are skipped.

    python scripts/bench/bench_ppo_halfcheetah.py --steps 50000 --seeds 0 1 2 [--variants ours sb3_subproc sb3_dummy]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _machine import exit_on_sigterm, machine_info  # scripts/bench is on sys.path when a bench runs

SB3 = """
import sys, time, json
t0 = time.perf_counter()
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
from stable_baselines3.common.evaluation import evaluate_policy
import gymnasium as gym
steps, seed, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cls = SubprocVecEnv if kind == "subproc" else DummyVecEnv
env = make_vec_env("HalfCheetah-v5", 8, seed=seed, vec_env_cls=cls)
model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
model.learn(total_timesteps=steps)
mean, std = evaluate_policy(model, gym.make("HalfCheetah-v5"), n_eval_episodes=10, deterministic=True)
env.close()
print(json.dumps({"return": float(mean), "return_std": float(std), "wall_s": time.perf_counter() - t0}))
"""


def run_ours(steps: int, seed: int, out: Path) -> dict:
    run_dir = out / f"ours_seed{seed}_run"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "embodied.cli", "train", "--task", "halfcheetah", "--run-dir",
                           str(run_dir), f"total_steps={steps}", f"seed={seed}", "log.progress=false"],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "train_s": summary["train_s"], "return": summary["eval/return"], "steps": summary["step"]}


def run_sb3(steps: int, seed: int, kind: str) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SB3, str(steps), str(seed), kind], capture_output=True, text=True,
                          check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - t0  # the whole process, interpreter start included
    return result


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=["ours", "sb3_subproc", "sb3_dummy"])
    p.add_argument("--out", default="bench_results/ppo_halfcheetah")
    args = p.parse_args()
    out = Path(args.out) / str(args.steps)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for variant in args.variants:
            path = out / f"{variant}_seed{seed}.json"
            if not path.exists():
                r = run_ours(args.steps, seed, out) if variant == "ours" else run_sb3(args.steps, seed,
                                                                                      variant.split("_")[1])
                path.write_text(json.dumps({"variant": variant, "seed": seed, "steps": args.steps, **r}))
            results.setdefault(variant, []).append(json.loads(path.read_text()))
    summary = {**machine_info(), "steps": args.steps}
    for variant, rows in results.items():
        summary[variant] = {"median_wall_s": statistics.median(r["wall_s"] for r in rows),
                            "median_return": statistics.median(r["return"] for r in rows),
                            "seeds": [r["seed"] for r in rows]}
    if "ours" in summary:
        for peer in ("sb3_subproc", "sb3_dummy"):
            if peer in summary:
                summary[f"speedup_vs_{peer}"] = summary[peer]["median_wall_s"] / summary["ours"]["median_wall_s"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
