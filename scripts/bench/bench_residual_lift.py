"""Residual lift on the tabletop (issue 12): per task and seed, at equal env steps,

- ``bc``: ``embodied collect-demos --episodes 50`` (default noise), then ``embodied train algo=bc data=DEMOS``
  (BC's defaults, ``--bc-steps`` gradient steps);
- ``residual``: ``embodied train algo=residual-ppo base=BC_RUN`` for ``--steps`` env steps;
- ``residual-sac``: ``embodied train algo=residual-sac base=BC_RUN`` (16 envs) for the same env steps;
- ``residual-td3``: ``embodied train algo=residual-td3 base=BC_RUN`` (16 envs), the same;
- ``residual-bundle``: residual-sac over BC's deploy bundle (``embodied export --run BC_RUN --format onnx``, then
  ``base=BUNDLE``): the base known only as its ONNX graph; ``residual-ppo-bundle``: residual-ppo over it;
  ``residual-td3-bundle``: residual-td3 over it;
- ``residual-sac-demos``: residual-sac with the 50 demonstrations in its replay (RLPD: ``residual-sac.demo_ratio=0.5``
  of each batch, ``data=DEMOS``), relabelled as the residual that turns the base's action into the demonstrated one;
- ``scratch``: ``embodied train algo=ppo`` for the same env steps;

each scored by ``embodied eval --run R --episodes 100`` (success rate; with ``--keep-best EVERY`` the RL variants
evaluate every EVERY env steps and the run keeps its best evaluated policy, ``log.keep_best``: ``embodied eval`` then
scores that policy on its own, held-out starts). The issue's goal: residual >= BC + 25 points
and >= 90% on pick-place, above scratch on both; demos + BC + residual within 30 minutes on 2 cores (reported as
``pipeline_wall_s``, from the first command's start). Resumable: one JSON per (task, variant, seed) under
``--out``; finished ones are skipped.

    python scripts/bench/bench_residual_lift.py [--tasks pick-place peg-insert] [--seeds 0 1 2] [--steps 150000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info, run_json  # noqa: E402

COMMON = ["log.progress=false", "log.eval_every=0", "log.checkpoint_every=0", "torch_threads=2"]
VARIANTS = {"bc": [], "residual": ["algo=residual-ppo", "num_envs=64"],
            "residual-sac": ["algo=residual-sac", "num_envs=16"], "residual-td3": ["algo=residual-td3", "num_envs=16"],
            "residual-sac-demos": ["algo=residual-sac", "num_envs=16", "residual-sac.demo_ratio=0.5"],
            "residual-bundle": ["algo=residual-sac", "num_envs=16"],
            "residual-ppo-bundle": ["algo=residual-ppo", "num_envs=64"],
            "residual-td3-bundle": ["algo=residual-td3", "num_envs=16"], "scratch": ["algo=ppo", "num_envs=64"]}
BUNDLED = tuple(v for v in VARIANTS if v.endswith("-bundle"))  # the base given as BC's ONNX bundle


def _run(cmd: list[str], timeout_s: float) -> tuple[dict, float]:
    out, wall, _ = run_json(cmd, timeout_s)
    return out, wall


def _train(task: str, run_dir: Path, args: list[str], timeout_s: float) -> tuple[dict, float]:
    if run_dir.exists():  # a run stopped before its JSON was written starts afresh
        shutil.rmtree(run_dir)
    return _run(["embodied", "train", "--task", task, "--run-dir", str(run_dir), *COMMON, *args], timeout_s)


def _eval(run_dir: Path, timeout_s: float) -> float:
    out, _ = _run(["embodied", "eval", "--run", str(run_dir), "--episodes", "100"], timeout_s)
    return out["eval/success"]


def main() -> None:
    from embodied.provenance import code_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="*", default=["pick-place", "peg-insert"])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=150_000, help="env steps of the residual and scratch learners")
    ap.add_argument("--bc-steps", type=int, default=5000, help="BC gradient steps")
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", default="bench_results/residual_lift")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra overrides of the residual variants' training (e.g. residual-sac.limit=[...])")
    ap.add_argument("--keep-best", type=int, default=0, metavar="EVERY",
                    help="RL variants evaluate every EVERY env steps and keep the best policy (log.keep_best); "
                         "0: the final policy (default)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        for seed in args.seeds:
            tag = f"{task}_seed{seed}"
            for variant in [v for v in VARIANTS if v in args.variants]:
                path = out / f"{variant}_{tag}.json"
                if path.exists():
                    continue
                print(f"running {variant} {tag}", file=sys.stderr, flush=True)
                row = {"task": task, "seed": seed, "variant": variant, "commit": code_commit()}
                run_dir = out / "runs" / f"{variant}_{tag}"
                if variant == "bc":
                    demos = out / "runs" / f"demos_{tag}"
                    shutil.rmtree(demos, ignore_errors=True)
                    summary, demo_wall = _run(["embodied", "collect-demos", "--task", task, "--episodes", "50",
                                               "--seed", str(seed), "--out", str(demos)], args.timeout_s)
                    _, wall = _train(task, run_dir, ["algo=bc", f"data={demos}", f"seed={seed}",
                                                     f"total_steps={args.bc_steps}"], args.timeout_s)
                    row.update(demos=summary, demos_wall_s=round(demo_wall, 1), train_wall_s=round(wall, 1))
                else:
                    bc = out / f"bc_{tag}.json"
                    bc_run = out / "runs" / f"bc_{tag}"
                    if variant.startswith("residual") and not bc.exists():
                        print(f"skipping {variant} {tag}: no bc run yet", file=sys.stderr)
                        continue
                    export_wall = 0.0
                    if variant in BUNDLED:  # BC as a bundle: only its ONNX graph reaches the learner
                        bundle = out / "runs" / f"bcbundle_{tag}"
                        shutil.rmtree(bundle, ignore_errors=True)
                        _, export_wall = _run(["embodied", "export", "--run", str(bc_run), "--format", "onnx",
                                               "--out", str(bundle)], args.timeout_s)
                        bc_run = bundle
                    base = [f"base={bc_run}", *args.set] if variant.startswith("residual") else []
                    if variant.endswith("-demos"):  # the demonstrations BC learnt from
                        base.append(f"data={out / 'runs' / f'demos_{tag}'}")
                    best = [f"log.eval_every={args.keep_best}", "log.keep_best=true"] if args.keep_best else []
                    summary, wall = _train(task, run_dir, [*VARIANTS[variant], *base, *best, f"seed={seed}",
                                                           f"total_steps={args.steps}"], args.timeout_s)
                    row.update(env_steps=args.steps, train_wall_s=round(wall + export_wall, 1),
                               overrides=args.set if variant.startswith("residual") else [])
                    if args.keep_best:  # the kept policy's step and its periodic evaluation (the run's own starts)
                        row.update(keep_best_every=args.keep_best, best_step=summary.get("best_step"),
                                   best_eval_success=summary.get("best/success"),
                                   final_eval_success=summary.get("eval/success"))
                row["success"] = _eval(run_dir, args.timeout_s)
                path.write_text(json.dumps(row, indent=1))
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    table = {}
    for r in rows:
        table.setdefault(r["task"], {}).setdefault(r["variant"], []).append(r["success"])
    pipeline = {}
    for task in args.tasks:
        for seed in args.seeds:
            for residual in (v for v in VARIANTS if v.startswith("residual")):
                files = [out / f"{v}_{task}_seed{seed}.json" for v in ("bc", residual)]
                if all(f.exists() for f in files):
                    bc, res = (json.loads(f.read_text()) for f in files)
                    pipeline[f"{residual}_{task}_seed{seed}"] = round(
                        bc["demos_wall_s"] + bc["train_wall_s"] + res["train_wall_s"], 1)
    emit({"bench": "residual_lift", "machine": machine_info(), "success": table, "pipeline_wall_s": pipeline,
          "runs": rows}, None)


if __name__ == "__main__":
    main()
