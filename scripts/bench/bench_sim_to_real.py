"""Sim-to-real, measured over the serial hardware-in-the-loop link; resumable, one JSON per (policy, plant).

Each policy (a run of ``quadrotor-hover``, trained with and without domain randomization) is exported to C
(``embodied export --format all``); its firmware flies ``serial://hil?plant=quadrotor-hover&<plant>`` in lock-step
(the plant waits for every action frame) for ``--episodes`` episodes from the task's full initial-state
distribution, against the nominal plant and the perturbed ones: mass +20%, thrust constant -10%, motor time
constant +30%, sensor noise x2, and all four at once. Success is the task's criterion (within 0.1 m for the
final 2 s of the 5 s episode). Results: ``OUT/<policy>__<plant>.json`` (finished ones are skipped on the next
run) and ``OUT/summary.json``.

Usage: ``python scripts/bench/bench_sim_to_real.py --policy dr=RUN_DR --policy nominal=RUN [--episodes 100]
[--out bench_results/sim_to_real]``. Train the runs with ``embodied train --task quadrotor-hover
env.domain_randomization.enabled=true seed=S`` and ``embodied train --task quadrotor-hover seed=S``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine_info  # noqa: E402

from embodied.hardware.bundle import export_run, read_bundle  # noqa: E402
from embodied.hardware.deploy import deploy  # noqa: E402

PLANTS = {
    "nominal": {},
    "mass+20": {"mass": 1.2},
    "thrust-10": {"thrust": 0.9},
    "motor_tau+30": {"motor_tau": 1.3},
    "noise_x2": {"noise": 2.0},
    "all_four": {"mass": 1.2, "thrust": 0.9, "motor_tau": 1.3, "noise": 2.0},
}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", action="append", required=True, help="NAME=RUN_DIR (repeatable)")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--plants", nargs="+", default=list(PLANTS))
    ap.add_argument("--out", default="bench_results/sim_to_real")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    summary = {"machine": machine, "episodes": args.episodes, "results": {}}
    for spec in args.policy:
        name, run = spec.split("=", 1)
        bundle = out / "bundles" / name
        if not (bundle / "bundle.json").exists() or args.force:
            export_run(Path(run), bundle, "all")
        meta = read_bundle(bundle)
        for i, plant in enumerate(args.plants):
            path = out / f"{name}__{plant}.json"
            if path.exists() and not args.force:
                res = json.loads(path.read_text())
            else:
                query = "&".join(f"{k}={v}" for k, v in PLANTS[plant].items())
                uri = f"serial://hil?plant=quadrotor-hover&seed={7000 + i}" + (f"&{query}" if query else "")
                t = time.monotonic()
                s = deploy(bundle, uri, duration=None, lockstep=True, episodes=args.episodes,
                           log_dir=out / "flights", status=False, log_states=False)
                k = round(s["success_rate"] * s["episodes"])
                res = {"policy": name, "run": str(Path(run).resolve()), "plant": plant, "factors": PLANTS[plant],
                       "uri": uri, "episodes": s["episodes"], "successes": k, "success_rate": s["success_rate"],
                       "ci95": wilson(k, s["episodes"]), "crashes": s["robot"]["crashes"],
                       "serial": {kk: s["robot"][kk] for kk in ("frames", "crc_errors", "timeouts",
                                                                "round_trip_us_mean")},
                       "outcome": s["outcome"], "wall_s": time.monotonic() - t,
                       "bundle_files": meta["files"], "c_size": meta["c"]["size"], "machine": machine}
                path.write_text(json.dumps(res, indent=1))
            summary["results"].setdefault(name, {})[plant] = {k: res[k] for k in ("success_rate", "ci95", "episodes",
                                                                                 "crashes")}
            print(f"{name:>10} {plant:>14}: {res['success_rate']:.2f} ({res['successes']}/{res['episodes']})",
                  file=sys.stderr)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
