"""The VLA on the real LIBERO-Spatial (issue 13; slow, in the LIBERO virtual environment): per task of the suite,

- ``expert``: ``embodied collect-demos --task libero:libero_spatial/K`` (the scripted (On A B) expert, DART noise 0.1
  by default) until ``--demos`` successful episodes; its success rate over every episode it played;
- ``bc``: ``embodied train algo=bc policy.arch=vla data=DEMOS`` (``--bc-steps`` gradient steps), scored by
  ``embodied eval --episodes --eval-episodes`` on the suite's initial states;
- ``grpo`` (with ``--rl-steps`` > 0): ``embodied train algo=grpo policy.arch=vla init=BC_RUN``, scored the same
  way (a task whose expert and BC already ran gets only this stage);
- ``--rescore N``: every finished task's BC and GRPO runs scored again by ``embodied eval --episodes N --seed
  --rescore-seed`` (the same N fresh starts for both; the in-run scores use ``--eval-episodes``, 20 by default,
  +-10 points), recorded as ``rescore`` in the task's JSON (skipped where that N and seed are there).

Observations: ``--observation state`` (LIBERO's object state; default: the pixel pipeline costs ~10x) or
``pixels``. Wall-clock per stage. Resumable: one JSON per (task, seed) under ``--out``; finished ones are skipped.

    .venv-libero/bin/python scripts/bench/bench_libero_spatial.py [--tasks 0 1 ... 9] [--demos 20] [--seeds 0]"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info, run_json  # noqa: E402


def _run(cmd: list[str], timeout_s: float) -> tuple[dict, float]:
    out, wall, _ = run_json(cmd, timeout_s)
    return out, wall


def _grpo(exe: str, task: str, k: int, bc_dir: Path, out: Path, args, common: list[str]) -> dict:
    """GRPO from the clone for ``--rl-steps`` env steps, scored on the suite's initial states like the clone."""
    rl, rl_wall = _run([exe, "train", "--task", task, "--run-dir", str(out / "runs" / f"grpo_task{k}"), "algo=grpo",
                        f"init={bc_dir}", f"total_steps={args.rl_steps}", "num_envs=8", "grpo.group_size=4",
                        "grpo.lr=1e-4", "grpo.temperature=1.0", *common], args.timeout_s)
    return {"grpo_success": rl.get("eval/success"), "grpo_wall_s": round(rl_wall, 1), "rl_steps": args.rl_steps}


def _rescore(exe: str, row: dict, out: Path, k: int, seed: int, args) -> dict | None:
    """``{"episodes", "seed", "bc", "grpo"}``: the task's BC and GRPO runs on the same ``--rescore`` fresh starts."""
    runs = {"bc": out / "runs" / f"bc_task{k}_seed{seed}", "grpo": out / "runs" / f"grpo_task{k}"}
    have = row.get("rescore") or {}
    if (have.get("episodes"), have.get("seed")) == (args.rescore, args.rescore_seed) and all(
            name in have for name, d in runs.items() if (d / "checkpoints").exists()):
        return None
    result = {"episodes": args.rescore, "seed": args.rescore_seed}
    for name, run in runs.items():
        if (run / "checkpoints").exists():
            print(f"rescoring {run.name} on {args.rescore} episodes", file=sys.stderr, flush=True)
            score, wall = _run([exe, "eval", "--run", str(run), "--episodes", str(args.rescore), "--seed",
                                str(args.rescore_seed)], args.timeout_s)
            result[name], result[f"{name}_wall_s"] = score.get("eval/success"), round(wall, 1)
    return result


def main() -> None:
    from embodied.provenance import code_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, nargs="*", default=list(range(10)))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--demos", type=int, default=20)
    ap.add_argument("--bc-steps", type=int, default=1500)
    ap.add_argument("--rl-steps", type=int, default=0)
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--rescore", type=int, default=0, help="score every finished BC and GRPO run again on this "
                    "many fresh starts (embodied eval)")
    ap.add_argument("--rescore-seed", type=int, default=7)
    ap.add_argument("--observation", default="state", choices=["state", "pixels"])
    ap.add_argument("--timeout-s", type=float, default=3 * 3600.0)
    ap.add_argument("--demo-timeout-s", type=float, default=600.0, help="an expert that needs longer fails the task")
    ap.add_argument("--out", default="bench_results/libero_spatial")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    exe = str(Path(sys.executable).parent / "embodied")  # the venv's own CLI
    env = [f"env.observation={args.observation}"]
    for seed in args.seeds:
        for k in args.tasks:
            path = out / f"task{k}_{args.observation}_seed{seed}.json"
            task = f"libero:libero_spatial/{k}"
            demos, bc_dir = out / "demos" / f"task{k}_seed{seed}", out / "runs" / f"bc_task{k}_seed{seed}"
            common = ["log.progress=false", "log.checkpoint_every=0", "torch_threads=2", "policy.arch=vla",
                      f"seed={seed}", "log.eval_every=0", f"log.eval_episodes={args.eval_episodes}", *env]
            done = json.loads(path.read_text()) if path.exists() else {}
            if done.get("finished"):  # the expert and BC ran: only an RL stage asked for now and not run yet
                if args.rl_steps > 0 and "grpo_success" not in done and done.get("bc_success") is not None:
                    print(f"running grpo on {task} seed {seed}", file=sys.stderr, flush=True)
                    done.update(_grpo(exe, task, k, bc_dir, out, args, common), commit=code_commit())
                    path.write_text(json.dumps(done, indent=1))
                continue
            print(f"running {task} seed {seed}", file=sys.stderr, flush=True)
            for d in (demos, bc_dir):
                if d.exists():
                    shutil.rmtree(d)
            try:
                expert, demo_wall = _run([exe, "collect-demos", "--task", task, "--episodes", str(args.demos),
                                          "--out", str(demos), "--seed", str(seed), "--num-envs", "4", *env],
                                         args.demo_timeout_s)
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # the expert fails the task: say so, go on
                path.write_text(json.dumps({"task": task, "seed": seed, "observation": args.observation,
                                            "expert_success_rate": 0.0, "expert_failed": str(e)[-300:],
                                            "finished": True, "commit": code_commit()}, indent=1))
                continue
            bc, bc_wall = _run([exe, "train", "--task", task, "--run-dir", str(bc_dir), "algo=bc", f"data={demos}",
                                f"total_steps={args.bc_steps}", "num_envs=4", "policy.vla.label_sigma=8",
                                *common], args.timeout_s)
            result = {"task": task, "seed": seed, "observation": args.observation,
                      "expert_success_rate": expert["expert_success_rate"],
                      "expert_episodes": expert["expert_episodes"],
                      "demos": args.demos, "demo_wall_s": round(demo_wall, 1), "bc_success": bc.get("eval/success"),
                      "bc_wall_s": round(bc_wall, 1)}
            if args.rl_steps > 0:
                result.update(_grpo(exe, task, k, bc_dir, out, args, common))
            result.update(finished=True, commit=code_commit(), machine=machine_info())
            path.write_text(json.dumps(result, indent=1))
    if args.rescore > 0:
        for seed in args.seeds:
            for k in args.tasks:
                path = out / f"task{k}_{args.observation}_seed{seed}.json"
                row = json.loads(path.read_text()) if path.exists() else {}
                if row.get("bc_success") is not None and (score := _rescore(exe, row, out, k, seed, args)):
                    row["rescore"] = score
                    path.write_text(json.dumps(row, indent=1))
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("task*_seed*.json"))]
    def mean_of(values: list) -> float | None:
        vals = [v for v in values if v is not None]
        return round(sum(vals) / len(vals), 3) if vals else None

    def mean(key: str) -> float | None:
        return mean_of([r.get(key) for r in rows])

    emit({"benchmark": "libero_spatial", "machine": machine_info(), "tasks": rows,
          "mean": {k: mean(k) for k in ("expert_success_rate", "bc_success", "grpo_success")},
          "rescore_mean": {k: mean_of([(r.get("rescore") or {}).get(k) for r in rows]) for k in ("bc", "grpo")}}, None)


if __name__ == "__main__":
    main()
