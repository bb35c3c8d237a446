"""The off-policy preset on HalfCheetah: `embodied train --task halfcheetah --preset fasttd3` with an
evaluation (10 deterministic episodes) every 20k steps; reports the wall-clock from the command's start
to the first evaluation >= --target (6000), the best return, and ms per critic update. Peer:
Stable-Baselines3 SAC with its defaults (1 env, batch 256, 256x256, UTD 1) on HalfCheetah-v5, the same
evaluations by an EvalCallback, the same budget; it needs over an hour here, so it is a variant of
its own. Resumable: one JSON per (variant, seed) under --out; finished ones are skipped.

    python scripts/bench/bench_offpolicy_halfcheetah.py --steps 350000 --seeds 0 [--variants fasttd3 sb3_sac]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _machine import exit_on_sigterm, machine_info  # scripts/bench is on sys.path when a bench runs

SB3 = """
import sys, time, json
t0 = time.perf_counter()
import gymnasium as gym
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
steps, seed, every, target = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
evals, eval_env = [], gym.make("HalfCheetah-v5")
class Eval(BaseCallback):
    def _on_step(self):
        if self.num_timesteps % every == 0:
            mean, std = evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)
            evals.append({"step": self.num_timesteps, "return": float(mean), "wall_s": time.perf_counter() - t0})
            print(json.dumps(evals[-1]), file=sys.stderr, flush=True)
            return mean < target  # stop once the target is reached
        return True
model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), seed=seed, device="cpu", verbose=0)
model.learn(total_timesteps=steps, callback=Eval())
print(json.dumps({"evals": evals, "wall_s": time.perf_counter() - t0}))
"""


def run_ours(steps: int, seed: int, out: Path, every: int) -> dict:
    run_dir = out / f"fasttd3_seed{seed}_run"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "embodied.cli", "train", "--task", "halfcheetah", "--preset", "fasttd3",
                    "--run-dir", str(run_dir), f"total_steps={steps}", f"seed={seed}", f"log.eval_every={every}",
                    "log.progress=false"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [{"step": r["step"], "return": r["eval/return"], "wall_s": r["time/wall_s"]} for r in rows
             if "eval/return" in r]
    updates = [r for r in rows if "td3/critic_loss" in r]
    last = updates[-1]
    # critic updates = env steps after warm-up x updates_per_step (1.0); train_s includes env stepping
    return {"evals": evals, "wall_s": wall, "train_s": last["time/train_s"], "steps": last["step"],
            "curve_png": str(run_dir / "learning_curve.png")}


def run_sb3(steps: int, seed: int, every: int, target: float) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SB3, str(steps), str(seed), str(every), str(target)],
                          capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - t0
    return result


def first_at(evals: list[dict], target: float) -> dict | None:
    return next((e for e in evals if e["return"] >= target), None)


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=350_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--variants", nargs="+", default=["fasttd3"])
    p.add_argument("--eval-every", type=int, default=20_000)
    p.add_argument("--target", type=float, default=6000.0)
    p.add_argument("--out", default="bench_results/offpolicy_halfcheetah")
    args = p.parse_args()
    out = Path(args.out) / str(args.steps)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {**machine_info(), "steps": args.steps, "target": args.target}
    for seed in args.seeds:
        for variant in args.variants:
            path = out / f"{variant}_seed{seed}.json"
            if not path.exists():
                r = (run_ours(args.steps, seed, out, args.eval_every) if variant == "fasttd3"
                     else run_sb3(args.steps, seed, args.eval_every, args.target))
                path.write_text(json.dumps({"variant": variant, "seed": seed, "steps": args.steps, **r}))
            r = json.loads(path.read_text())
            hit = first_at(r["evals"], args.target)
            summary[f"{variant}_seed{seed}"] = {
                "wall_s": r["wall_s"], "best_return": max(e["return"] for e in r["evals"]),
                "final_return": r["evals"][-1]["return"],
                "target_wall_s": hit["wall_s"] if hit else None, "target_step": hit["step"] if hit else None}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
