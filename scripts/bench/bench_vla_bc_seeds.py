"""How much of a mini-libero clone's success is its training seed (issue 13): behaviour cloning of one fixed set of
demonstrations (``--demos`` per task, collected once with ``--demo-seed``) under each named variant (a list of
``train`` settings), for every BC seed in ``--seeds``, each scored by ``embodied eval --episodes 130`` (the same
starts for every run). Reports each variant's mean, standard deviation, range and per-group means over the seeds:
one seed's figure differs from the next by more than most choices of the clone change it, so a choice is judged on
the mean of several.

Resumable: one JSON per (variant, seed) under ``--out``; finished ones are skipped.

    python scripts/bench/bench_vla_bc_seeds.py --variants default continuous:policy.vla.head=tokens \\
        [--seeds 0 1 2 3] [--demos 10] [--heldout] [--out bench_results/vla_bc_seeds]

A variant is ``NAME`` (the task's defaults) or ``NAME:KEY=VALUE,KEY=VALUE``."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402
from bench_vla_lift import BC, _collect_demos, _eval, _train  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, settings = text.partition(":")
    return name, [s for s in settings.split(",") if s]


def main() -> None:
    from embodied.provenance import code_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--demos", type=int, default=10, help="demonstrations per task")
    ap.add_argument("--demo-seed", type=int, default=0, help="the demonstrations' seed (bench_vla_lift's)")
    ap.add_argument("--bc-steps", type=int, default=2000)
    ap.add_argument("--eval-episodes", type=int, default=130)
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--heldout", action="store_true",
                    help="also evaluate each clone on the held-out paraphrases (env.phrasing=heldout)")
    ap.add_argument("--out", default="bench_results/vla_bc_seeds")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    demos = out / "demos" / f"demos{args.demos}_seed{args.demo_seed}"
    if not (demos / "done").exists():
        summary, wall = _collect_demos(demos, args.demos, args.demo_seed, args.timeout_s)
        (demos / "done").write_text(json.dumps({"summary": summary, "wall_s": round(wall, 1)}))
    variants = [parse_variant(v) for v in args.variants]
    for name, settings in variants:
        for seed in args.seeds:
            path = out / f"{name}_seed{seed}.json"
            if path.exists() and json.loads(path.read_text()).get("finished"):
                result = json.loads(path.read_text())
                if args.heldout and "heldout" not in result:
                    result["heldout"] = _eval(out / "runs" / f"{name}_seed{seed}", args.eval_episodes,
                                              args.timeout_s, "env.phrasing=heldout")
                    path.write_text(json.dumps(result, indent=1))
                continue
            print(f"running {name} seed {seed}", file=sys.stderr, flush=True)
            run_dir = out / "runs" / f"{name}_seed{seed}"
            t0 = time.perf_counter()
            _, wall, _ = _train(run_dir, [*BC, *settings, f"seed={seed}", f"data={demos}",
                                          f"total_steps={args.bc_steps}"], args.timeout_s)
            result = {"variant": name, "settings": settings, "seed": seed, "demos": str(demos),
                      "train_wall_s": round(wall, 1), "eval": _eval(run_dir, args.eval_episodes, args.timeout_s),
                      "wall_s": round(time.perf_counter() - t0, 1), "finished": True, "commit": code_commit(),
                      "machine": machine_info()}
            if args.heldout:
                result["heldout"] = _eval(run_dir, args.eval_episodes, args.timeout_s, "env.phrasing=heldout")
            path.write_text(json.dumps(result, indent=1))
    table = []
    for name, settings in variants:
        runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{name}_seed*.json"))]
        runs = [r for r in runs if r["seed"] in args.seeds]
        success = [r["eval"]["success"] for r in runs]
        if not success:
            continue
        groups = {g: round(statistics.mean(r["eval"]["per_group"][g] for r in runs), 3)
                  for g in runs[0]["eval"]["per_group"]}
        table.append({"variant": name, "settings": settings, "seeds": [r["seed"] for r in runs],
                      "success": [round(s, 3) for s in success], "mean": round(statistics.mean(success), 3),
                      "sd": round(statistics.stdev(success), 3) if len(success) > 1 else None,
                      "min": round(min(success), 3), "max": round(max(success), 3), "per_group_mean": groups,
                      "heldout_mean": round(statistics.mean(r["heldout"]["success"] for r in runs), 3)
                      if all("heldout" in r for r in runs) else None})
    emit({"benchmark": "vla_bc_seeds", "machine": machine_info(), "demos": str(demos), "variants": table}, None)


if __name__ == "__main__":
    main()
