"""The control loop in real time over the serial hardware-in-the-loop link; prints one JSON object.

For each rate (default 100 and 500 Hz): ``embodied deploy`` of a C bundle on ``serial://hil?plant=quadrotor-hover``
(the generated firmware on a pty pair, pyserial on the HAL side, the simulator as the plant), ``--duration``
seconds of flight. Reported per rate: achieved rate, the fraction of ticks whose command reached the robot
before the next deadline (missed slots count as late), start jitter p50/p99/max, overruns (whole slots
missed), the serial round trip, and the policy's (firmware's) time per tick. At 500 Hz the plant still
advances 10 ms per action (it is trained at 100 Hz): the figure is the loop's timing, not flight quality.

Usage: ``python scripts/bench/bench_control_loop.py [--bundle B] [--rates 100 500] [--duration 10] [--out F]``
(without ``--bundle``: a freshly initialized quadrotor actor at the default sizes, exported with its C).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402

import embodied  # noqa: E402
from embodied.hardware.bundle import write_bundle  # noqa: E402
from embodied.hardware.deploy import deploy  # noqa: E402
from embodied.policies import DeterministicActor  # noqa: E402


def fresh_bundle(out: Path) -> Path:
    torch.manual_seed(0)
    env = embodied.make_env("quadrotor-hover", num_envs=1024)
    obs = env.reset(seed=0)[0]["policy"].numpy()
    actor = DeterministicActor(obs.shape[1], 4, [128, 128], "relu", False, group=env.symmetry_group().to_spec())
    write_bundle(actor.eval(), env.layout(), obs, out, "all", task="quadrotor-hover")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--rates", type=float, nargs="+", default=[100.0, 500.0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {"machine": machine_info(), "duration_s": args.duration, "rates": {}}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(args.bundle) if args.bundle else fresh_bundle(Path(tmp) / "bundle")
        result["bundle"] = args.bundle or "fresh init (default sizes)"
        for rate in args.rates:
            s = deploy(bundle, "serial://hil?plant=quadrotor-hover", duration=args.duration, rate=rate,
                       log_dir=Path(tmp) / "flights", status=False)
            rows = [json.loads(line) for line in Path(s["log"]).read_text().splitlines()]
            policy_us = [r["policy_us"] for r in rows if r.get("policy_us") is not None]
            ticks = [r for r in rows if "tick" in r]
            worst = sorted(ticks, key=lambda r: -r["late_ms"])[:3]  # where the largest start delays were
            worst = [{"tick": r["tick"], "late_ms": r["late_ms"], "mode": r["mode"],
                      "episode_end_before": any(t.get("episode_end") for t in ticks[max(0, r["tick"] - 2):r["tick"]])}
                     for r in worst]
            result["rates"][str(int(rate))] = {
                "achieved_hz": s["achieved_hz"], "ticks": s["ticks"], "on_time_fraction": s["on_time_fraction"],
                "jitter": s["jitter"], "overruns": s["overruns"], "missed_commands": s["missed_commands"],
                "serial_round_trip_us_mean": s["robot"]["round_trip_us_mean"],
                "serial_round_trip_us_p99": s["robot"]["round_trip_us_p99"],
                "policy_call_us_p50": float(np.percentile(policy_us, 50)) if policy_us else None,
                "policy_call_us_p99": float(np.percentile(policy_us, 99)) if policy_us else None,
                "outcome": s["outcome"], "timeouts": s["robot"]["timeouts"], "crc_errors": s["robot"]["crc_errors"],
                "latest_ticks": worst,
            }
            print(f"{rate:.0f} Hz: {json.dumps(result['rates'][str(int(rate))])}", file=sys.stderr)
    emit(result, args.out)


if __name__ == "__main__":
    main()
