"""Policies flown over every driver in real time; prints one JSON object (and writes it with --out).

For each route, ``--flights`` flights of ``--duration`` s from the task's random initial states (seeds 0..F-1):
  sim          ``sim://<task>`` (the HAL's onnxruntime runner)
  serial_hil   ``serial://hil?plant=quadrotor-hover`` (the generated C in the firmware, over a pty)    RPM bundle
  crazyflie_oot  ``crazyflie://udp://`` to the SITL Crazyflie, the generated C as its out-of-tree controller,
               selected and fed its hover target through the unmodified cflib                            RPM bundle
  mavlink      ``mavlink://udp:`` to the SITL PX4-style vehicle: thrust + body-rate set-points            rates bundle
  crazyflie_rates  ``crazyflie://udp://`` with cflib MANUAL rate set-points                              rates bundle
Per flight: the distance to the set-point over the last 2 s (mean, max), whether it stayed within 0.1 m for
those 2 s (the task's criterion), plant crashes, achieved loop rate and p99 jitter.

Usage: ``python scripts/bench/bench_driver_flights.py --rpm-bundle B1 --rates-bundle B2 [--flights 5] [--out F]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402

from embodied.hardware.deploy import deploy  # noqa: E402
from embodied.hardware.sitl.crazyflie import CrazyflieVehicle  # noqa: E402
from embodied.hardware.sitl.mavlink import MavlinkVehicle  # noqa: E402


def flight_stats(summary: dict, tail_s: float, rate: float) -> dict:
    rows = [json.loads(line) for line in Path(summary["log"]).read_text().splitlines()]
    pos = np.array([r["state"][:3] for r in rows if "tick" in r and r["mode"] == "active"])
    d = np.linalg.norm(pos, axis=1)
    tail = d[-int(tail_s * rate):]
    return {"dist_tail_mean_m": float(tail.mean()), "dist_tail_max_m": float(tail.max()),
            "held": bool(tail.max() <= 0.1), "start_dist_m": float(d[0]), "achieved_hz": summary["achieved_hz"],
            "jitter_p99_ms": summary["jitter"]["p99_ms"], "outcome": summary["outcome"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rpm-bundle", required=True, help="a quadrotor-hover bundle with C (--format all)")
    ap.add_argument("--rates-bundle", required=True, help="a quadrotor-hover-rates bundle")
    ap.add_argument("--flights", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = {"machine": machine_info(), "flights": args.flights, "duration_s": args.duration, "routes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        for route in ("sim", "serial_hil", "crazyflie_oot", "mavlink", "crazyflie_rates"):
            res = []
            for seed in range(args.flights):
                kw = dict(duration=args.duration, status=False, log_dir=logs)
                crashes = None
                if route == "sim":
                    s = deploy(args.rpm_bundle, f"sim://quadrotor-hover?seed={seed}", **kw)
                    crashes = s["robot"]["crashes"]
                elif route == "serial_hil":
                    s = deploy(args.rpm_bundle, f"serial://hil?plant=quadrotor-hover&seed={seed}", **kw)
                    crashes = s["robot"]["crashes"]
                elif route == "crazyflie_oot":
                    with CrazyflieVehicle(0, seed=seed, onboard=args.rpm_bundle) as v:
                        s = deploy(args.rpm_bundle, f"crazyflie://udp://127.0.0.1:{v.port}", **kw)
                        crashes = v.counts.get("crashes", 0)
                elif route == "mavlink":
                    with MavlinkVehicle(0 + 14600 + seed, seed=seed) as v:
                        s = deploy(args.rates_bundle, f"mavlink://udp:127.0.0.1:{14600 + seed}", **kw)
                        crashes = v.counts.get("crashes", 0)
                else:
                    with CrazyflieVehicle(0, seed=seed) as v:
                        s = deploy(args.rates_bundle, f"crazyflie://udp://127.0.0.1:{v.port}", **kw)
                        crashes = v.counts.get("crashes", 0)
                res.append({"seed": seed, "crashes": crashes, **flight_stats(s, 2.0, s["rate_hz"])})
            out["routes"][route] = {"flights": res, "held": sum(r["held"] for r in res),
                                    "dist_tail_mean_m": float(np.mean([r["dist_tail_mean_m"] for r in res]))}
            print(route, json.dumps({k: v for k, v in out["routes"][route].items() if k != "flights"}), file=sys.stderr)
    emit(out, args.out)


if __name__ == "__main__":
    main()
