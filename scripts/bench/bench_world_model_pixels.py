"""The RSSM on pendulum-pixels (issue 11): open-loop PSNR against horizon on held-out episodes, and a video of
real beside imagined frames.

The fit is ``embodied wm-fit``'s (``RSSMFit``): ``--episodes`` real episodes of ``pendulum-pixels`` (64x64 RGB) with
uniform random actions; the RSSM sees the newest frame and the critic's 3-vector. Held out: 8 more from another
seed. The RSSM (``--preset`` size1m by default, conv depth ``--depth``) trains in chunks of 50 updates, saved after
every chunk under ``--out``, so the benchmark resumes where it stopped (``--updates`` is the total). Reported every
``--report-every`` updates: PSNR per open-loop step after 5 context frames, and its mean over the first 1, 5, 15
and 50 steps. ``--out`` holds the model as ``world_model.pt`` (``make_env("wm:pendulum-pixels", model=OUT)``).

    python scripts/bench/bench_world_model_pixels.py [--updates 3000] [--out bench_results/world_model_pixels]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine_info  # noqa: E402


def main() -> None:
    from embodied.provenance import code_commit
    from embodied.sim_backends.world_model.rssm import PRESETS
    from embodied.sim_backends.world_model.sequences import open_loop_psnr
    from embodied.tasks.world_model.report import open_loop_video
    from embodied.tasks.world_model.rssm_fit import RSSMFit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--episodes", type=int, default=24, help="training episodes of 200 steps")
    ap.add_argument("--preset", default="size1m", choices=list(PRESETS))
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--report-every", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench_results/world_model_pixels")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    fit = RSSMFit("pendulum-pixels", out, {}, None, args.episodes, args.preset, args.depth, args.batch, args.length)
    held_out, _ = fit.record(None, 8, 1)
    result_path = out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else \
        {"bench": "world_model_pixels", "task": "pendulum-pixels", "args": vars(args), "machine": machine_info(),
         "parameters": fit.result["parameters"], "reports": []}
    while fit.result["updates"] < args.updates:
        target = min(args.updates, (fit.result["updates"] // args.report_every + 1) * args.report_every)
        fit.fit(target)
        rep = open_loop_psnr(fit.model, held_out, context=5, horizon=50)
        result["reports"].append({"updates": fit.result["updates"], "train_s": round(fit.result["train_s"], 1),
                                  "mean_psnr": rep["mean_psnr"], "psnr": [round(v, 2) for v in rep["psnr"]],
                                  "reward_mae_mean": sum(rep["reward_mae"]) / len(rep["reward_mae"])})
        open_loop_video(rep, out / f"open_loop_{fit.result['updates']:06d}.mp4")
        print(json.dumps(result["reports"][-1]), file=sys.stderr, flush=True)
        result.update(updates=fit.result["updates"], train_s=fit.result["train_s"], commit=code_commit())
        result_path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
