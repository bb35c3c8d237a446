"""Pixels to driving (issue 10): PPO on ``drive-lane-keep`` from the 64x112 front camera, with and without GSDrive's
trajectory probing at equal env steps, beside the privileged-state policy as the upper reference. Every run is
``embodied train`` with the task's defaults (``configs/drive-lane-keep.yaml``: 200k env steps, 16 envs); its
evaluations drive the held-out scenes (route completion, collision rate, success), wall-clock from the command's
start. Resumable: one JSON per (variant, seed) under ``--out``; finished runs are skipped (``--force`` redoes them).

    python scripts/bench/bench_drive_pixels.py [--variants pixels probe state] [--seeds 0 1 2]"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import exit_on_sigterm, machine_info  # noqa: E402

VARIANTS = {"pixels": [], "probe": ["env.probing=true"], "state": ["env.observation=state"]}


def run(variant: str, seed: int, out: Path, extra: list[str], timeout_s: float) -> dict:
    run_dir = out / "runs" / f"{variant}_seed{seed}"
    cmd = ["embodied", "train", "--task", "drive-lane-keep", "--run-dir", str(run_dir), f"seed={seed}",
           "log.progress=false", *VARIANTS[variant], *extra]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, "timeout"
    wall = time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()] \
        if (run_dir / "metrics.jsonl").exists() else []
    evals = [r for r in rows if "eval/route_completion" in r]
    last = evals[-1] if evals else {}
    from embodied.provenance import code_commit

    return {"variant": variant, "seed": seed, "command": " ".join(cmd), "returncode": rc, "commit": code_commit(),
            "process_wall_s": round(wall, 1), "env_steps": last.get("step"),
            "route_completion_heldout": last.get("eval/route_completion"),
            "collision_rate_heldout": last.get("eval/collision"), "offroad_rate_heldout": last.get("eval/offroad"),
            "success_heldout": last.get("eval/success"),
            "curve": [(r["step"], round(r["eval/route_completion"], 3), round(r["eval/collision"], 3),
                       round(r.get("time/wall_s", 0.0), 1)) for r in evals],
            "stderr_tail": err.strip().splitlines()[-3:] if rc else []}


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--extra", nargs="*", default=[], help="overrides for every run")
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", default="bench_results/drive_pixels")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for variant in args.variants:
            path = out / f"{variant}_seed{seed}.json"
            if path.exists() and not args.force:
                continue
            print(f"running {variant} seed {seed}", file=sys.stderr, flush=True)
            path.write_text(json.dumps(run(variant, seed, out, args.extra, args.timeout_s), indent=1))
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    summary = {"bench": "drive_pixels", "machine": machine_info(), "runs": [
        {k: r[k] for k in ("variant", "seed", "process_wall_s", "env_steps", "route_completion_heldout",
                           "collision_rate_heldout", "success_heldout")} for r in results]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
