"""World models (issue 11): dream-to-real, and open-loop error against horizon.

For a task T (pendulum by default):

- ``real``: the task's learner in the real simulator (SAC on pendulum, TD3 on quadrotor-hover), evaluated every
  ``log.eval_every`` real steps. Its budget B is the first evaluation at >= 90% of its final return (success for
  tasks that report it, i.e. quadrotor-hover), measured from ``random``'s return as the zero;
- ``random``: uniform random actions on the evaluation env (R_random);
- ``dream``: ``embodied train --task wm:T env.mode=dream total_steps=B``: B real steps only fit the model, SAC
  learns only from imagined rollouts; evaluated on the real task (R_dream). Then ``embodied wm-report`` on it;
- ``dyna``: the same with ``env.mode=dyna`` (SAC also learns from the B real steps);
- ``dream-dreamer``: ``dream`` with DreamerV1/V2's learner instead (``--preset dreamer``, configs/dreamer.yaml:
  dreamer-ac's actor maximizes lambda-returns backpropagated through the model's steps);
- ``dream-long``: ``dream``'s policy trained on in ``dream``'s final model (fitted on all B real steps) for
  ``--long-steps`` more imagined steps, no real step: ``embodied train --task wm:T env.model=DREAM_RUN init=DREAM_RUN``
  (its actor warm-started, a fresh critic learning the actor's values for ``--burn-in`` imagined steps before the
  actor moves). Still a policy trained only in a model of B real steps: imagination costs compute, not samples.

Score = (R_dream - R_random) / (R_real(B) - R_random), R_real(B) the real learner's evaluation at B. R_dream is the
policy the run keeps: its last (``--select last``), or with ``--select model`` the one of its evaluations whose
imagined return in the newest model was highest (``log.keep_best_by=model``: the kept policy re-scored beside each new
one; no real step chooses it, so its logged real evaluation is an unbiased R_dream). Resumable: one
JSON per (variant, task, seed) under ``--out``; finished ones are skipped (``--force`` redoes them).

    python scripts/bench/bench_world_model.py [--tasks pendulum] [--seeds 0] [--variants real random dream dyna]"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import exit_on_sigterm, machine_info  # noqa: E402

# the real learner per task, with the same learner, network sizes and evaluation as the model-based runs:
# pendulum: SAC at an update-to-data ratio of 1 (the usual SAC), the PolicyConfig defaults;
# quadrotor-hover: configs/quadrotor-hover.yaml as it is (TD3, stops at 95% success), evaluated on 100 episodes;
REAL = {"pendulum": ["algo=sac", "num_envs=4", "total_steps=20000", "sac.updates_per_step=1", "sac.warmup_steps=1000",
                     "log.eval_every=1000", "log.eval_episodes=20", "log.checkpoint_every=0"],
        "quadrotor-hover": ["log.eval_every=10000", "log.eval_episodes=100", "log.checkpoint_every=0"],
        # halfcheetah: the SAC run of bench_mbpo_halfcheetah.py (1 env, UTD 1, 256x256, 100k steps, evaluated every
        # 10k on 10 episodes): give that run with --real-from instead of training it again
        "halfcheetah": ["algo=sac", "num_envs=1", "total_steps=100000", "sac.updates_per_step=1",
                        "sac.warmup_steps=5000", "policy.actor_hidden=[256,256]", "policy.critic_hidden=[256,256]",
                        "policy.activation=relu", "policy.obs_normalization=true", "log.eval_every=10000",
                        "log.eval_episodes=10", "log.checkpoint_every=0"]}
ALGO = {"pendulum": "sac", "quadrotor-hover": "td3", "halfcheetah": "sac"}  # configs/wm-<task>.yaml's learner
LONG_ENVS = 128  # dream-long: model envs (the imagined rollouts of configs/wm-quadrotor-hover.yaml)
# the rest from configs/wm-<task>.yaml
MODEL = {"pendulum": ["log.eval_every=1000", "log.eval_episodes=20"],
         "quadrotor-hover": ["log.eval_every=10000", "log.eval_episodes=100"],
         "halfcheetah": ["log.eval_every=5000", "log.eval_episodes=10", "log.checkpoint_every=0"]}


VARIANTS = ("real", "random", "dream", "dyna", "dream-long", "dream-dreamer")
DREAMER = ["--preset", "dreamer"]  # configs/dreamer.yaml


def _train(args: list[str], run_dir: Path, timeout_s: float) -> tuple[dict, float, list[dict]]:
    if run_dir.exists():  # a run stopped before its JSON was written: start it afresh (train appends to metrics)
        shutil.rmtree(run_dir)
    cmd = ["embodied", "train", "--run-dir", str(run_dir), "log.progress=false", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return {"command": " ".join(cmd), **json.loads(proc.stdout.strip().splitlines()[-1])}, wall, \
        [r for r in rows if "eval/return" in r]


def _score(r: dict) -> float:
    return r["eval/success"] if "eval/success" in r else r["eval/return"]


def kept_score(record: dict) -> tuple[float, int]:
    """The real score of the policy a model run keeps, and its step: the kept best's evaluation where the run kept one
    (``log.keep_best``), else the last evaluation."""
    summary = record["summary"]
    if "best_step" in summary:
        return summary.get("best/success", summary["best/return"]), summary["best_step"]
    return record["curve"][-1][1], record["curve"][-1][0]


def run_real(task: str, seed: int, out: Path, timeout_s: float, extra=()) -> dict:
    summary, wall, evals = _train(["--task", task, f"seed={seed}", *REAL[task], *extra],
                                  out / "runs" / f"real_{task}_seed{seed}", timeout_s)
    return {"summary": summary, "process_wall_s": round(wall, 1),
            "curve": [(r["step"], _score(r), round(r["time/wall_s"], 1)) for r in evals]}


def read_real(run_dir: Path) -> dict:
    """``run_real``'s record from a finished run of the same settings made elsewhere (``--real-from``)."""
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    evals = [r for r in rows if "eval/return" in r]
    if not evals:
        raise SystemExit(f"--real-from {run_dir}: no evaluations in its metrics.jsonl")
    return {"summary": {"run_dir": str(run_dir), **{k: v for k, v in evals[-1].items() if k.startswith("eval/")}},
            "process_wall_s": round(evals[-1]["time/wall_s"], 1), "from_run": str(run_dir),
            "curve": [(r["step"], _score(r), round(r["time/wall_s"], 1)) for r in evals]}


def run_random(task: str, seed: int) -> dict:
    import torch

    import embodied.tasks  # noqa: F401
    from embodied.config import load_config
    from embodied.evaluate import evaluate, make_eval_env

    cfg = load_config(task, None, [f"seed={seed}", *REAL[task]])
    env = make_eval_env(cfg, num_envs=100)
    g = torch.Generator().manual_seed(seed)
    low = torch.as_tensor(env.single_action_space.low)
    high = torch.as_tensor(env.single_action_space.high)
    act = lambda o: low + torch.rand(o.shape[0], low.numel(), generator=g) * (high - low)  # noqa: E731
    return evaluate(act, env, seed=seed + 12345)


def budget(real: dict, random_score: float) -> int:
    """The first evaluation step at >= 90% of the final score, measured from the random score."""
    curve = real["curve"]
    final = curve[-1][1]
    target = random_score + 0.9 * (final - random_score)
    return next(step for step, score, _ in curve if score >= target)


def run_model(task: str, variant: str, seed: int, steps: int, out: Path, timeout_s: float, extra=()) -> dict:
    run_dir = out / "runs" / f"{variant}_{task}_seed{seed}"
    mode, learner = ("dream", DREAMER) if variant == "dream-dreamer" else (variant, [])
    summary, wall, evals = _train(["--task", f"wm:{task}", f"seed={seed}", f"env.mode={mode}", f"total_steps={steps}",
                                   *MODEL[task], *learner, *extra], run_dir, timeout_s)
    report = subprocess.run(["embodied", "wm-report", "--run", str(run_dir)], capture_output=True, text=True,
                            timeout=timeout_s)
    open_loop = json.loads((run_dir / "wm_report.json").read_text()) if report.returncode == 0 else None
    return {"summary": summary, "process_wall_s": round(wall, 1), "real_steps": steps,
            "curve": [(r["step"], _score(r), round(r["time/wall_s"], 1)) for r in evals],
            "open_loop": {k: open_loop[k] for k in ("horizons", "termination_accuracy_1step", "held_out_steps")}
            if open_loop else report.stderr.strip()[-300:]}


def run_dream_long(task: str, seed: int, steps: int, burn_in: int, out: Path, timeout_s: float, extra=()) -> dict:
    dream = out / "runs" / f"dream_{task}_seed{seed}"
    run_dir = out / "runs" / f"dream-long_{task}_seed{seed}"
    algo = ALGO[task]
    summary, wall, evals = _train(["--task", f"wm:{task}", f"seed={seed}", f"env.model={dream}", f"init={dream}",
                                   f"num_envs={LONG_ENVS}", f"total_steps={steps}", f"{algo}.warmup_steps=0",
                                   f"{algo}.critic_burn_in={burn_in}", *MODEL[task], f"log.eval_every={steps // 20}",
                                   *extra],
                                  run_dir, timeout_s)
    return {"summary": summary, "process_wall_s": round(wall, 1), "imagined_steps": steps,
            "curve": [(r["step"], _score(r), round(r["time/wall_s"], 1)) for r in evals]}


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="*", default=["pendulum"], choices=list(REAL))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--variants", nargs="*", default=["real", "random", "dream", "dyna"], choices=VARIANTS)
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", default="bench_results/world_model")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--long-steps", type=int, default=1_000_000, help="dream-long: imagined env steps")
    ap.add_argument("--burn-in", type=int, default=50_000, help="dream-long: imagined steps of critic-only learning")
    ap.add_argument("--real-from", type=Path, help="a finished run of the real learner with the settings of REAL "
                    "(one task and seed), used as the 'real' variant instead of training it again")
    ap.add_argument("--select", default="last", choices=["last", "model"],
                    help="the policy a model run (dream, dyna, dream-long) keeps: its last, or the best by imagined "
                         "return in the newest model (log.keep_best_by=model)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra overrides of every trained variant (real, dream, dyna, dream-long: the same learner "
                         "settings on both sides), recorded in their JSON")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from embodied.provenance import code_commit

    # said either way: a preset may keep a best policy by default, and "last" must mean the last
    select = ["log.keep_best=true", "log.keep_best_by=model"] if args.select == "model" else ["log.keep_best=false"]
    for task in args.tasks:
        for seed in args.seeds:
            done = {}
            for variant in VARIANTS:
                path = out / f"{variant}_{task}_seed{seed}.json"
                if path.exists() and not (args.force and variant in args.variants):
                    done[variant] = json.loads(path.read_text())
                    continue
                if variant not in args.variants:
                    continue
                print(f"running {variant} {task} seed {seed}", file=sys.stderr, flush=True)
                if variant == "real":
                    result = read_real(args.real_from) if args.real_from else run_real(task, seed, out, args.timeout_s,
                                                                                            args.set)
                elif variant == "random":
                    result = run_random(task, seed)
                elif variant == "dream-long":
                    if "dream" not in done:
                        print(f"skipping dream-long {task} seed {seed}: no dream run yet", file=sys.stderr)
                        continue
                    result = run_dream_long(task, seed, args.long_steps, args.burn_in, out, args.timeout_s,
                                            [*args.set, *select])
                else:
                    steps = budget(done["real"], done["random"].get("eval/success", done["random"]["eval/return"]))
                    result = run_model(task, variant, seed, steps, out, args.timeout_s, [*args.set, *select])
                overrides = [] if variant == "random" else args.set if variant == "real" else [*args.set, *select]
                done[variant] = {"variant": variant, "task": task, "seed": seed, "commit": code_commit(),
                                 "overrides": overrides, **result}
                path.write_text(json.dumps(done[variant], indent=1))
    summary = {"bench": "world_model", "machine": machine_info(), "runs": []}
    for task in args.tasks:
        for seed in args.seeds:
            files = {v: out / f"{v}_{task}_seed{seed}.json" for v in VARIANTS}
            if not all(files[v].exists() for v in ("real", "random", "dream")):
                continue
            r = {v: json.loads(p.read_text()) for v, p in files.items() if p.exists()}
            rand = r["random"].get("eval/success", r["random"]["eval/return"])
            b = budget(r["real"], rand)
            real_at_b = next(s for step, s, _ in r["real"]["curve"] if step == b)
            row = {"task": task, "seed": seed, "budget_real_steps": b, "R_random": rand, "R_real_at_budget": real_at_b,
                   "R_real_final": r["real"]["curve"][-1][1], "real_wall_s_to_budget":
                   next(w for step, _, w in r["real"]["curve"] if step == b)}
            for mode in [m for m in VARIANTS if m not in ("real", "random") and m in r]:
                final, kept_step = kept_score(r[mode])
                row[f"R_{mode}"] = final
                row[f"{mode}_kept_step"] = kept_step
                row[f"{mode}_to_real_score"] = (final - rand) / (real_at_b - rand)
                row[f"{mode}_wall_s"] = r[mode]["process_wall_s"]
                if mode == "dream-long":
                    row["dream-long_imagined_steps"] = r[mode]["imagined_steps"]
                    continue
                ol = r[mode]["open_loop"]
                row[f"{mode}_open_loop_nmse"] = {h: v["nmse"] for h, v in ol["horizons"].items()} \
                    if isinstance(ol, dict) else ol
            summary["runs"].append(row)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
