"""Learning to fly: process wall-clock until quadrotor-hover meets the success criterion, ours vs SB3.

Criterion (all learners alike): an evaluation every 10k env steps on 100 strict random initial states
(``embodied.evaluate.evaluate``, deterministic actions, the task's eval config: full initial-state
distribution, frozen curriculum; fresh starts at every evaluation, ``eval_seed(cfg, step)``); the run
stops at the second consecutive evaluation with >= 95% success (the rule ``embodied train`` applies below
200 evaluation starts), or at 300k env steps.
The stopped policy is then evaluated once more on 100 fresh starts (another seed) and that figure is
reported too.

Learners, each in its own process, timed from the command's start until the process exits:
  ours      ``embodied train --task quadrotor-hover seed=S`` (defaults)
  sb3_td3   Stable-Baselines3 TD3 on the same env through ``embodied.to_sb3``: our network sizes (actor
            128x128, twin critics 64x64, relu), batch, learning rates, tau, gamma, n-step, exploration and
            target noise, warm-up, 8 envs and update ratio (0.2 critic updates per env step, actor every 2nd)
  sb3_sac   Stable-Baselines3 SAC, the same sizes, batch, learning rates, update ratio (auto entropy)
Peers are capped at ``--peer-cap-s`` (20 min) of wall-clock.

Resumable: one JSON per (learner, seed) under ``--out``; finished ones are skipped when run again
(``--force`` redoes them). The summary (printed as JSON, also written to ``summary.json``) has the
per-seed table, medians and the ratios of ours to each peer over the seeds both ran.

    python scripts/bench/bench_learning_to_fly.py [--seeds 0 1 ... 9] [--peer-seeds 0 1 2]
        [--learners ours sb3_td3 sb3_sac] [--out bench_results/learning_to_fly] [--ours-args k=v ...]
        [--then-args k=v ...]

``--then-args``: ours is a two-stage pipeline, the second ``embodied train`` started from the first's policy
(``init=``): e.g. randomized plants, TD3 for 200k env steps without the stop rule, then ``algo=apg`` for 99,840
model steps with it (README). Walls and steps add up; the second stage is the one judged.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import exit_on_sigterm, machine_info  # noqa: E402

CRITERION = 0.95
EVAL_EVERY = 10_000
EVAL_EPISODES = 100
TOTAL_STEPS = 300_000
PASSES = 2  # consecutive evaluations at or above the criterion
FRESH_SEED = 90_000  # + seed: the initial-state seed of the final check on fresh starts
PEERS = ("sb3_td3", "sb3_sac")


def _passed(success: float) -> bool:
    return success >= CRITERION - 1e-6  # 95 of 100 is 0.9499999881 as a float32 mean


# ---- ours -----------------------------------------------------------------------------------------
def _train(cmd: list[str], timeout_s: float) -> tuple[int | None, str, float]:
    """One ``embodied train`` process: its exit status (None: timed out), stderr and wall-clock seconds."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        returncode, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        returncode, err = None, (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    return returncode, err, time.perf_counter() - t0


def run_ours(seed: int, extra: list[str], timeout_s: float, run_dir: Path, then: list[str] | None = None) -> dict:
    """One run of ours into ``run_dir`` (replaced when it exists); its older checkpoints are removed afterwards (the
    newest holds the run's policy, which the fresh check here and bench_hover_ceiling.py read). With ``then`` a
    second run follows from the first's policy (``init=``, into ``run_dir/then``): a two-stage pipeline (TD3, then
    ``algo=apg``) whose walls and steps add up, and whose second stage is judged (stop rule, fresh check)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    def command(into: Path, overrides: list[str]) -> list[str]:
        return ["embodied", "train", "--task", "quadrotor-hover", "--run-dir", str(into), f"seed={seed}",
                "log.progress=false", *overrides]

    cmd = command(run_dir, extra)
    returncode, err, wall = _train(cmd, timeout_s)
    commands, steps_before, judged = [" ".join(cmd)], 0, run_dir
    if then is not None and returncode == 0:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        steps_before = max(r["step"] for r in rows)
        judged = run_dir / "then"
        cmd = command(judged, [f"init={run_dir}", *then])
        returncode, err, second = _train(cmd, timeout_s)
        wall += second
        commands.append(" ".join(cmd))
    if not (judged / "metrics.jsonl").exists():  # a stage that did not start (its error is in stderr_tail)
        return {"learner": "ours", "seed": seed, "command": " && ".join(commands), "returncode": returncode,
                "process_wall_s": round(wall, 2), "solved": False, "stderr_tail": err.strip().splitlines()[-1:],
                "run_dir": str(judged)}
    rows = [json.loads(line) for line in (judged / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/success" in r]
    solved = next((r for r in rows if "solved/train_s" in r), None)
    from embodied.checkpoint import checkpoint_paths
    from embodied.evaluate_run import evaluate_run

    fresh = evaluate_run(judged, episodes=EVAL_EPISODES, seed=FRESH_SEED + seed)
    for old in checkpoint_paths(run_dir)[:-1] + (checkpoint_paths(judged)[:-1] if judged != run_dir else []):
        old.unlink()  # each TD3 checkpoint holds the replay: 80-800 MB
    return {
        "learner": "ours", "seed": seed, "command": " && ".join(commands), "returncode": returncode,
        "process_wall_s": round(wall, 2),
        "solved": solved is not None,
        # with a second stage: the first's env steps plus the second's (APG's are model steps), and the second's times
        "first_stage_steps": steps_before if then is not None else None,
        "solved_at_env_steps": steps_before + solved["step"] if solved else None,
        "solved_train_s": round(solved["solved/train_s"], 2) if solved else None,
        "env_steps": steps_before + evals[-1]["step"] if evals else None,
        "final_eval_success": evals[-1]["eval/success"] if evals else None,
        "fresh_eval_success": fresh["eval/success"],
        "eval_curve": [(steps_before + r["step"], round(r["eval/success"], 3), round(r["time/wall_s"], 1))
                       for r in evals],
        "stderr_tail": err.strip().splitlines()[-1:] if returncode else [],
        "run_dir": str(judged),
    }


# ---- peers (run in a child process of this script: --peer NAME) ---------------------------------------
def peer_main(name: str, seed: int, cap_s: float, out: Path) -> None:
    """The body of a peer's process; writes its JSON to ``out``. ``t0`` is this process's start."""
    import numpy as np
    import psutil
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.noise import NormalActionNoise

    import embodied
    from embodied.config import load_config
    from embodied.core.registry import TASKS
    from embodied.evaluate import eval_seed, evaluate, make_eval_env

    t_start = psutil.Process().create_time()
    torch.set_num_threads(1)  # as ours (torch_threads: 1)
    cfg = load_config("quadrotor-hover", overrides=[f"seed={seed}"])  # ours: the same task config, sizes, eval
    algo = cfg.algo_config
    n = cfg.num_envs
    env = embodied.to_sb3(TASKS.get(cfg.task).make(cfg.env, num_envs=n, device="cpu", seed=seed))
    eval_env = make_eval_env(cfg, num_envs=EVAL_EPISODES)
    # 0.2 critic updates per env step: SB3 trains every train_freq vector steps (n env steps each)
    train_freq = 5
    grad_steps = round(algo.updates_per_step * n * train_freq)
    common = dict(learning_rate=algo.lr_critic, buffer_size=TOTAL_STEPS, learning_starts=algo.warmup_steps,
                  batch_size=algo.batch_size, tau=algo.tau, gamma=algo.gamma, train_freq=train_freq,
                  gradient_steps=grad_steps, n_steps=algo.n_step, seed=seed, device="cpu", verbose=0,
                  policy_kwargs={"activation_fn": torch.nn.ReLU, "net_arch": {
                      "pi": list(cfg.policy.actor_hidden), "qf": list(cfg.policy.critic_hidden)}})
    if name == "sb3_td3":
        model = TD3("MlpPolicy", env, policy_delay=algo.actor_every, target_policy_noise=algo.target_noise,
                    target_noise_clip=algo.target_noise_clip,
                    action_noise=NormalActionNoise(np.zeros(4), np.full(4, algo.exploration_noise)), **common)
    else:
        model = SAC("MlpPolicy", env, **common)
    config = (f"{type(model).__name__} MlpPolicy pi {list(cfg.policy.actor_hidden)} "
              f"qf {list(cfg.policy.critic_hidden)} relu, batch {algo.batch_size}, lr {algo.lr_critic}, "
              f"tau {algo.tau}, gamma {algo.gamma}, n_steps {algo.n_step}, learning_starts {algo.warmup_steps}, "
              f"{n} envs, train_freq {train_freq} x gradient_steps {grad_steps} "
              f"(= {grad_steps / (n * train_freq):.2f} per env step)")

    class Judge(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval, self.curve, self.passes, self.solved = EVAL_EVERY, [], 0, None

        def _on_step(self) -> bool:
            if time.time() - t_start > cap_s or self.num_timesteps >= TOTAL_STEPS:
                return False
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += EVAL_EVERY

            def act(obs):
                action, _ = self.model.predict(obs.numpy(), deterministic=True)
                return torch.as_tensor(action)

            res = evaluate(act, eval_env, seed=eval_seed(cfg, self.num_timesteps))
            self.curve.append((self.num_timesteps, round(res["eval/success"], 3), round(time.time() - t_start, 1)))
            self.passes = self.passes + 1 if _passed(res["eval/success"]) else 0
            if self.passes >= PASSES:
                self.solved = self.num_timesteps
                return False
            return True

    judge = Judge()
    model.learn(total_timesteps=TOTAL_STEPS + n, callback=judge)

    def act(obs):
        action, _ = model.predict(obs.numpy(), deterministic=True)
        return torch.as_tensor(action)

    fresh = evaluate(act, eval_env, seed=FRESH_SEED + seed)
    out.write_text(json.dumps({
        "learner": name, "seed": seed, "config": config, "cap_s": cap_s,
        "solved": judge.solved is not None, "solved_at_env_steps": judge.solved,
        "env_steps": int(model.num_timesteps),
        "final_eval_success": judge.curve[-1][1] if judge.curve else None,
        "fresh_eval_success": fresh["eval/success"],
        "eval_curve": judge.curve,
        "capped": judge.solved is None and time.time() - t_start > cap_s,
    }))


def run_peer(name: str, seed: int, cap_s: float) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"l2f_{name}_")) / "result.json"
    cmd = [sys.executable, __file__, "--peer", name, "--seeds", str(seed), "--peer-cap-s", str(cap_s),
           "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cap_s + 600)
    wall = time.perf_counter() - t0
    if proc.returncode:
        return {"learner": name, "seed": seed, "error": proc.stderr.strip().splitlines()[-3:],
                "process_wall_s": round(wall, 2)}
    return {**json.loads(out.read_text()), "process_wall_s": round(wall, 2)}


# ---- summary ------------------------------------------------------------------------------------
def summarize(results: dict[tuple[str, int], dict]) -> dict:
    out: dict = {}
    learners = sorted({k[0] for k in results}, key=lambda s: (s != "ours", s))
    for name in learners:
        runs = [results[k] for k in sorted(results) if k[0] == name]
        walls = [r["process_wall_s"] for r in runs if r.get("solved")]
        out[name] = {
            "table": [{k: r.get(k) for k in ("seed", "solved", "solved_at_env_steps", "process_wall_s",
                                             "final_eval_success", "fresh_eval_success")} for r in runs],
            "solved": f"{sum(bool(r.get('solved')) for r in runs)} of {len(runs)}",
            "fresh_eval_at_least_95": f"{sum((r.get('fresh_eval_success') or 0) >= CRITERION - 1e-6 for r in runs)} "
                                      f"of {len(runs)}",
            "median_process_wall_s": statistics.median(r["process_wall_s"] for r in runs) if runs else None,
            "max_process_wall_s": max(r["process_wall_s"] for r in runs) if runs else None,
            "median_solved_process_wall_s": statistics.median(walls) if walls else None,
        }
    ours = {k[1]: v for k, v in results.items() if k[0] == "ours"}
    for name in PEERS:
        peer = {k[1]: v for k, v in results.items() if k[0] == name}
        common = sorted(set(ours) & set(peer))
        if common:
            # an unsolved (capped) peer counts with its wall-clock: the ratio is then an upper bound
            o = statistics.median(ours[s]["process_wall_s"] for s in common)
            p = statistics.median(peer[s]["process_wall_s"] for s in common)
            out[f"ratio_ours_over_{name}_median_process_wall"] = {
                "seeds": common, "ratio": round(o / p, 4),
                "peer_solved_all": all(peer[s].get("solved") for s in common)}
    return out


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="*", default=list(range(10)), help="seeds for ours")
    ap.add_argument("--peer-seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--learners", nargs="*", default=["ours", *PEERS])
    ap.add_argument("--peer-cap-s", type=float, default=1200.0, help="wall-clock cap per peer run (20 min)")
    ap.add_argument("--ours-timeout-s", type=float, default=1800.0)
    ap.add_argument("--ours-args", nargs="*", default=[], help="extra overrides for ours")
    ap.add_argument("--then-args", nargs="*", default=None,
                    help="a second stage for ours from the first's policy (init=), e.g. algo=apg total_steps=99840")
    ap.add_argument("--out", default="bench_results/learning_to_fly")
    ap.add_argument("--force", action="store_true", help="redo finished (learner, seed) runs")
    ap.add_argument("--peer", default=None, help=argparse.SUPPRESS)  # internal: run one peer in this process
    args = ap.parse_args()
    if args.peer:
        return peer_main(args.peer, args.seeds[0], args.peer_cap_s, Path(args.out))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [("ours", s) for s in args.seeds if "ours" in args.learners]
    jobs += [(p, s) for p in PEERS if p in args.learners for s in args.peer_seeds]
    for name, seed in jobs:
        path = out / f"{name}_seed{seed}.json"
        if path.exists() and not args.force:
            continue
        print(f"running {name} seed {seed}", file=sys.stderr, flush=True)
        res = run_ours(seed, args.ours_args, args.ours_timeout_s, out / "runs" / f"ours_seed{seed}", args.then_args) \
            if name == "ours" else run_peer(
            name, seed, args.peer_cap_s)
        path.write_text(json.dumps(res, indent=1))
    results = {}
    for path in out.glob("*_seed*.json"):
        r = json.loads(path.read_text())
        results[(r["learner"], r["seed"])] = r
    summary = {"benchmark": "learning_to_fly", "machine": machine_info(),
               "criterion": f"{PASSES} consecutive evaluations with >= {CRITERION:.0%} of {EVAL_EPISODES} strict "
                            f"random starts (every {EVAL_EVERY} env steps), within {TOTAL_STEPS} env steps",
               "ours_args": args.ours_args, "then_args": args.then_args, **summarize(results)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
