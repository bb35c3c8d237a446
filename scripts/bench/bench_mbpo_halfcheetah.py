"""Sample efficiency of model-based training on HalfCheetah (issue 11): ``wm:halfcheetah`` in Dyna/MBPO mode (SAC
learning from 400 imagined rollouts per real step beside the real one, update-to-data ratio 10 per real step,
the ensemble refitted every 1000 real steps for 5 epochs) against our SAC in the real simulator (update-to-data
ratio 1), both with 256x256 networks, batch 256, 100k real steps, 10 evaluation episodes every 10k real steps.
MBPO reports about 10x fewer real steps than SAC for the same return.

It takes hours: every run checkpoints every 10k real steps, and running the benchmark again resumes an
unfinished run (``embodied train --resume``) and skips finished ones; one JSON per (variant, seed) under ``--out``.

    python scripts/bench/bench_mbpo_halfcheetah.py [--variants mbpo sac] [--seeds 0] [--steps 100000]"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import exit_on_sigterm, machine_info  # noqa: E402

# the same for both, stated (configs/halfcheetah.yaml is PPO's; the running observation normalization is the
# PolicyConfig default, and the learner's normalizer sees imagined observations too in the MBPO run)
COMMON = ["policy.actor_hidden=[256,256]", "policy.critic_hidden=[256,256]", "policy.activation=relu",
          "policy.obs_normalization=true",
          "log.eval_every=10000", "log.eval_episodes=10", "log.checkpoint_every=10000", "log.keep_checkpoints=1",
          "log.progress=false", "torch_threads=2"]
VARIANTS = {
    "mbpo": ["--task", "wm:halfcheetah"],  # configs/wm-halfcheetah.yaml: the MBPO settings of the docstring
    "sac": ["--task", "halfcheetah", "algo=sac", "num_envs=1", "sac.updates_per_step=1", "sac.warmup_steps=5000"],
}


def run(variant: str, seed: int, steps: int, out: Path, timeout_s: float) -> dict:
    run_dir = out / "runs" / f"{variant}_seed{seed}"
    resuming = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    cmd = ["embodied", "train", "--resume", str(run_dir), f"total_steps={steps}"] if resuming else \
        ["embodied", "train", "--run-dir", str(run_dir), f"seed={seed}", f"total_steps={steps}", *VARIANTS[variant],
         *COMMON]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()] \
        if (run_dir / "metrics.jsonl").exists() else []
    evals = [(r["step"], round(r["eval/return"], 1), round(r.get("time/train_s", 0.0), 1)) for r in rows
             if "eval/return" in r]
    updates = [r for r in rows if "sac/q_mean" in r]
    return {"variant": variant, "seed": seed, "command": " ".join(cmd), "returncode": proc.returncode,
            "finished": bool(evals) and evals[-1][0] >= steps, "this_call_wall_s": round(wall, 1), "evals": evals,
            "stderr_tail": proc.stderr.strip().splitlines()[-3:] if proc.returncode else [],
            "last_row": {k: v for k, v in (updates[-1] if updates else {}).items()
                         if k.startswith(("model/", "imagined/", "time/"))}}


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    from embodied.provenance import code_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--timeout-s", type=float, default=3 * 3600.0, help="per call; a stopped run resumes next time")
    ap.add_argument("--out", default="bench_results/mbpo_halfcheetah")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for variant in args.variants:
            path = out / f"{variant}_seed{seed}.json"
            if path.exists() and json.loads(path.read_text()).get("finished"):
                continue
            print(f"running {variant} seed {seed}", file=sys.stderr, flush=True)
            try:
                result = run(variant, seed, args.steps, out, args.timeout_s)
            except subprocess.TimeoutExpired:
                result = {"variant": variant, "seed": seed, "finished": False, "stderr_tail": ["timeout: run again"]}
            path.write_text(json.dumps({**result, "commit": code_commit()}, indent=1))
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    print(json.dumps({"bench": "mbpo_halfcheetah", "machine": machine_info(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
