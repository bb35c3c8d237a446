"""The RSSM on pendulum-pixels (issue 11): open-loop PSNR against horizon on held-out episodes, and a video of
real beside imagined frames.

Training data: ``--episodes`` real episodes of ``pendulum-pixels`` (64x64 RGB) with uniform random actions; the
RSSM sees the newest frame and the critic's 3-vector. Held out: 8 more from another seed. The RSSM (``--preset``
size1m by default, conv depth ``--depth``) trains in chunks of 50 updates; its weights and optimizer are saved
after every chunk, so the benchmark resumes where it stopped (``--updates`` is the total). Reported every
``--report-every`` updates: PSNR per open-loop step after 5 context frames, and its mean over the first 1, 5, 15
and 50 steps; then the model is written as ``world_model.pt`` (``make_env("wm:pendulum-pixels", model=OUT)``).

    python scripts/bench/bench_world_model_pixels.py [--updates 3000] [--out bench_results/world_model_pixels]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine_info  # noqa: E402


def record(num_episodes: int, seed: int) -> tuple[dict, torch.Tensor]:
    """Sequences of what the RSSM sees (the newest frame and the critic's state), and the task's observations."""
    import embodied
    from embodied.sim_backends.world_model.sequences import model_observation, to_sequences
    from embodied.tasks.world_model.report import record_real

    env = embodied.make_env("pendulum-pixels", num_envs=num_episodes, seed=seed)
    g = torch.Generator().manual_seed(seed)
    data = record_real(env, lambda o: torch.rand(o.shape[0], 1, generator=g) * 2 - 1, seed, 0.0, g)
    groups = [(k, s.shape[0]) for k, s in env.single_observation_space.spaces.items()]
    task_obs = data["state"]
    data["state"] = model_observation(task_obs, groups, "policy", env.image_shape, 3)
    return to_sequences(data), task_obs


def main() -> None:
    from embodied.provenance import code_commit
    from embodied.sim_backends.world_model import MODEL_FILE, save_world_model
    from embodied.sim_backends.world_model.rssm import PRESETS, RSSM, RSSMConfig
    from embodied.sim_backends.world_model.sequences import fit_rssm, open_loop_psnr, parameter_count, rssm_starts
    from embodied.tasks.world_model.report import open_loop_video

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
    out.mkdir(parents=True, exist_ok=True)
    cfg = RSSMConfig(**PRESETS[args.preset], depth=args.depth, batch_size=args.batch, length=args.length)
    torch.manual_seed(0)
    model = RSSM(1, cfg, image=(3, 64, 64), vector=3)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    state_path, result_path = out / "rssm_state.pt", out / "result.json"
    result = {"bench": "world_model_pixels", "task": "pendulum-pixels", "args": vars(args), "machine": machine_info(),
              "parameters": parameter_count(model), "updates": 0, "train_s": 0.0, "reports": []}
    if state_path.exists():
        saved = torch.load(state_path, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        g.set_state(saved["generator"])
        result = json.loads(result_path.read_text())
    (train, train_obs), (held_out, _) = record(args.episodes, 0), record(8, 1)
    while result["updates"] < args.updates:
        t0 = time.perf_counter()
        metrics = fit_rssm(model, opt, train, 50, g)
        result["train_s"] += time.perf_counter() - t0
        result["updates"] += 50
        result["last_metrics"] = metrics
        if result["updates"] % args.report_every == 0 or result["updates"] >= args.updates:
            model.eval()
            rep = open_loop_psnr(model, held_out, context=5, horizon=50)
            model.train()
            result["reports"].append({"updates": result["updates"], "train_s": round(result["train_s"], 1),
                                      "mean_psnr": rep["mean_psnr"], "psnr": [round(v, 2) for v in rep["psnr"]],
                                      "reward_mae_mean": sum(rep["reward_mae"]) / len(rep["reward_mae"])})
            open_loop_video(rep, out / f"open_loop_{result['updates']:06d}.mp4")
            starts, start_obs = rssm_starts(model, train, train_obs, context=5, stride=10, generator=g)
            save_world_model(out / MODEL_FILE, model, cfg, "pendulum-pixels", {}, starts, starts[:0],
                             start_obs=start_obs, image_group="policy", frame_channels=3)
            print(json.dumps(result["reports"][-1]), file=sys.stderr, flush=True)
        result["commit"] = code_commit()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "generator": g.get_state()}, state_path)
        result_path.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "last_metrics"}, indent=1))


if __name__ == "__main__":
    main()
