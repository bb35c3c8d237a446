"""Behaviour-cloning heads on the tabletop (issue 12): from the same 50 ``collect-demos`` episodes (default noise) per
task and seed, ``embodied train algo=bc`` with

- ``mse``: the per-step MLP (BC's defaults);
- ``chunk``: an action-chunked MLP (``bc.chunk=8``, 4 executed, ACT style);
- ``chunk-ensemble``: the same chunks acted with ACT's temporal ensembling (``bc.ensemble=0.01``);
- ``flow``: the flow-matching chunk head (``bc.head=flow``, chunk 8, 10 Euler steps, lr 3e-3);
- ``flow-ensemble``: the flow head with temporal ensembling;

all for ``--bc-steps`` gradient steps, each scored by ``embodied eval --run R --episodes 100`` (success rate).
Resumable: one JSON per (task, variant, seed) under ``--out``; finished ones are skipped.

    python scripts/bench/bench_bc_heads.py [--tasks pick-place] [--seeds 0] [--variants mse chunk ...]"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info, run_json  # noqa: E402

COMMON = ["log.progress=false", "log.eval_every=0", "log.checkpoint_every=0", "torch_threads=2"]
CHUNK = ["bc.chunk=8", "bc.execute=4"]
FLOW = [*CHUNK, "bc.head=flow", "bc.lr=3e-3"]
VARIANTS = {"mse": [], "chunk": CHUNK, "chunk-ensemble": [*CHUNK, "bc.ensemble=0.01"], "flow": FLOW,
            "flow-ensemble": [*FLOW, "bc.ensemble=0.01"]}


def main() -> None:
    from embodied.provenance import code_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="*", default=["pick-place"])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--bc-steps", type=int, default=5000)
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", default="bench_results/bc_heads")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        for seed in args.seeds:
            tag = f"{task}_seed{seed}"
            demos = out / "runs" / f"demos_{tag}"
            for variant in args.variants:
                path = out / f"{variant}_{tag}.json"
                if path.exists():
                    continue
                if not demos.with_suffix(".json").exists():
                    shutil.rmtree(demos, ignore_errors=True)
                    summary, wall, _ = run_json(["embodied", "collect-demos", "--task", task, "--episodes", "50",
                                                 "--seed", str(seed), "--out", str(demos)], args.timeout_s)
                    demos.with_suffix(".json").write_text(json.dumps({**summary, "wall_s": round(wall, 1)}))
                print(f"running {variant} {tag}", file=sys.stderr, flush=True)
                run_dir = out / "runs" / f"{variant}_{tag}"
                shutil.rmtree(run_dir, ignore_errors=True)
                _, wall, _ = run_json(["embodied", "train", "--task", task, "--run-dir", str(run_dir), "algo=bc",
                                       f"data={demos}", f"seed={seed}", f"total_steps={args.bc_steps}",
                                       *VARIANTS[variant], *COMMON], args.timeout_s)
                ev, eval_wall, _ = run_json(["embodied", "eval", "--run", str(run_dir), "--episodes", "100"],
                                            args.timeout_s)
                path.write_text(json.dumps({"task": task, "seed": seed, "variant": variant, "commit": code_commit(),
                                            "settings": VARIANTS[variant], "bc_steps": args.bc_steps,
                                            "train_wall_s": round(wall, 1), "eval_wall_s": round(eval_wall, 1),
                                            "success": ev["eval/success"]}, indent=1))
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    table: dict = {}
    for r in rows:
        table.setdefault(r["task"], {}).setdefault(r["variant"], []).append(r["success"])
    demos = {p.stem: json.loads(p.read_text()) for p in sorted((out / "runs").glob("demos_*.json"))}
    emit({"bench": "bc_heads", "machine": machine_info(), "success": table, "demos": demos, "runs": rows}, None)


if __name__ == "__main__":
    main()
