"""Learning to fly: wall-clock until >= 95% of 100 random initial states succeed on quadrotor-hover.

Runs ours (``embodied train --task quadrotor-hover`` with its defaults, in a subprocess) and the
peer, Stable-Baselines3 SAC on the same task through ``embodied.to_sb3`` (hyperparameters matched
to ours where SB3 has them), in the same invocation, and prints one JSON object with the ratio.
Both are judged by the same evaluator (``embodied.evaluate.evaluate``: 100 envs, one episode each,
deterministic actions, the same initial-state seed) every ``--eval-every`` env steps.

    python scripts/bench/bench_learning_to_fly.py [--peer-cap-s 1200] [--skip-peer] [--ours-args ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CRITERION = 0.95
MILESTONES = (0.05, 0.25, 0.5, 0.8, CRITERION)  # success levels timed on both sides, for a ratio short of 95%


def milestones(curve: list) -> dict:
    """First (env steps, train seconds) at which eval success reached each level; curve rows are
    (env steps, success, train seconds)."""
    out = {}
    for level in MILESTONES:
        hit = next((r for r in curve if r[1] >= level), None)
        out[f"{level:.2f}"] = {"env_steps": hit[0], "train_s": hit[2]} if hit else None
    return out


def _peak_rss_mb(pid: int, stop: threading.Event, out: list) -> None:
    import psutil

    peak = 0
    try:
        proc = psutil.Process(pid)
        while not stop.is_set():
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            peak = max(peak, rss)
            time.sleep(0.05)
    except psutil.Error:
        pass
    out.append(peak / 2**20)


def run_ours(extra: list[str], timeout_s: float) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="l2f_ours_")) / "run"
    cmd = [sys.executable, "-m", "embodied.cli", "train", "--task", "quadrotor-hover", "--run-dir", str(run_dir),
           "log.progress=false", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop, peak = threading.Event(), []
    watcher = threading.Thread(target=_peak_rss_mb, args=(proc.pid, stop, peak))
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/success" in r]
    solved = next((r for r in evals if r["eval/success"] >= CRITERION - 1e-6), None)
    return {
        "command": " ".join(cmd[2:]),
        "returncode": proc.returncode,
        "process_wall_s": round(wall, 2),
        "solved": solved is not None,
        "solved_at_env_steps": solved["step"] if solved else None,
        "solved_train_s": round(solved["time/train_s"], 2) if solved else None,
        "final_eval_success": evals[-1]["eval/success"] if evals else None,
        "eval_curve": [(r["step"], round(r["eval/success"], 3), round(r["time/train_s"], 1)) for r in evals],
        "peak_rss_mb": round(peak[0], 1) if peak else None,
        "stderr_tail": err.strip().splitlines()[-1:] if proc.returncode else [],
    }


def run_sb3_sac(cap_s: float, eval_every: int, num_envs: int, seed: int) -> dict:
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    import embodied
    from embodied.config import load_config
    from embodied.core.registry import TASKS
    from embodied.evaluate import eval_seed, evaluate, make_eval_env

    run_cfg = load_config("quadrotor-hover", overrides=[f"seed={seed}"])  # ours: the same task config and eval
    env = embodied.to_sb3(TASKS.get(run_cfg.task).make(run_cfg.env, num_envs=num_envs, device="cpu", seed=seed))
    eval_env = make_eval_env(run_cfg, num_envs=100)
    model = SAC("MlpPolicy", env, learning_rate=1e-3, buffer_size=300_000, learning_starts=5000, batch_size=128,
                gamma=0.99, tau=0.005, train_freq=1, gradient_steps=2, target_entropy=-4.0,
                policy_kwargs={"net_arch": [64, 64]}, seed=seed, device="cpu", verbose=0)

    class Judge(BaseCallback):
        def __init__(self):
            super().__init__()
            self.train_s, self.t0, self.next_eval, self.curve, self.solved = 0.0, None, eval_every, [], None

        def _on_training_start(self):
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return self.train_s + time.perf_counter() - self.t0 < cap_s
            self.train_s += time.perf_counter() - self.t0
            self.next_eval += eval_every

            def act(obs):
                action, _ = self.model.predict(obs.numpy(), deterministic=True)
                return torch.as_tensor(action)

            res = evaluate(act, eval_env, seed=eval_seed(run_cfg))
            self.curve.append((self.num_timesteps, round(res["eval/success"], 3), round(self.train_s, 1)))
            self.t0 = time.perf_counter()
            if res["eval/success"] >= CRITERION - 1e-6:
                self.solved = (self.num_timesteps, self.train_s)
                return False
            return self.train_s < cap_s

    judge = Judge()
    t0 = time.perf_counter()
    model.learn(total_timesteps=10**9, callback=judge)
    return {
        "config": "SB3 SAC MlpPolicy net_arch [64,64], batch 128, lr 1e-3, learning_starts 5000, "
                  f"train_freq 1 x {num_envs} envs, gradient_steps 2, target_entropy -4",
        "process_wall_s": round(time.perf_counter() - t0, 2),
        "cap_s": cap_s,
        "solved": judge.solved is not None,
        "solved_at_env_steps": judge.solved[0] if judge.solved else None,
        "solved_train_s": round(judge.solved[1], 2) if judge.solved else None,
        "env_steps": int(model.num_timesteps),
        "final_eval_success": judge.curve[-1][1] if judge.curve else None,
        "eval_curve": judge.curve,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-cap-s", type=float, default=1200.0, help="training-time cap for SB3 (20 min)")
    ap.add_argument("--ours-timeout-s", type=float, default=900.0)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations (both sides)")
    ap.add_argument("--ours-args", nargs="*", default=[], help="extra overrides for ours (default: none)")
    ap.add_argument("--ours-seeds", type=int, nargs="*", default=[0],
                    help="seeds for ours, run one after another; the first (0, the default) is compared with the peer")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = {"benchmark": "learning_to_fly", "criterion": f">= {CRITERION:.0%} of 100 random initial states",
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    runs = [run_ours([f"seed={seed}", f"log.eval_every={args.eval_every}", *args.ours_args], args.ours_timeout_s)
            for seed in args.ours_seeds]
    result["ours"] = runs[0]
    if len(runs) > 1:
        times = [r["solved_train_s"] for r in runs if r["solved"]]
        result["ours_seeds"] = {
            "seeds": args.ours_seeds, "solved": sum(r["solved"] for r in runs),
            "solved_train_s": [r["solved_train_s"] for r in runs],
            "solved_at_env_steps": [r["solved_at_env_steps"] for r in runs],
            "process_wall_s": [r["process_wall_s"] for r in runs],
            "median_solved_train_s": statistics.median(times) if len(times) == len(runs) else None}
    if not args.skip_peer:
        result["sb3_sac"] = run_sb3_sac(args.peer_cap_s, args.eval_every, num_envs=8, seed=0)
        o, p = result["ours"], result["sb3_sac"]
        o["milestones"], p["milestones"] = milestones(o["eval_curve"]), milestones(p["eval_curve"])
        result["milestone_ratio_ours_over_sb3_train_s"] = {
            k: (round(o["milestones"][k]["train_s"] / p["milestones"][k]["train_s"], 4)
                if o["milestones"][k] and p["milestones"][k] else None) for k in o["milestones"]}
        if o["solved"]:
            peer_time = p["solved_train_s"] if p["solved"] else p["cap_s"]
            result["ratio_ours_over_sb3_train_s"] = round(o["solved_train_s"] / peer_time, 4)
            result["ratio_is_upper_bound"] = not p["solved"]  # peer capped: true ratio is smaller
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
