"""The CUDA paths, measured beside the CPU on the same machine (run on a GPU machine; CI never needs one; the CUDA
physics' parity with the CPU's is a test: ``tests/kernels/test_quadrotor_kernel.py``):

- **env step**: env-steps/s of the tensor tasks' full step (physics, reward, termination, reset, observation;
  ``make_env(task, num_envs=N, device=...)``, random actions) on the CPU (all its threads) and on CUDA, per batch;
- **training**: the wall of a short default quadrotor-hover run (TD3) with sim and learner on each device;
- **VLA**: the mini-libero-sized VLA's forward at batch 1, 64 and 1024 on each device.

    python scripts/bench/bench_cuda_paths.py [--quick] [--out bench_results/cuda_paths.json]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info, rate, run_json  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def env_rate(task: str, n: int, device: str, seconds: float) -> float:
    import embodied

    env = embodied.make_env(task, num_envs=n, device=device, seed=0)
    env.reset(seed=0)
    space = env.single_action_space
    low = torch.as_tensor(space.low, device=env.device)
    high = torch.as_tensor(space.high, device=env.device)
    gen = torch.Generator(device=env.device).manual_seed(0)

    def step():
        u = torch.rand((n, *space.shape), generator=gen, device=env.device)
        env.step(low + u * (high - low))
        _sync(device)

    out = rate(step, n, seconds)
    env.close()
    return out


def vla_forward(device: str, batches=(1, 64, 1024), repeats: int = 50) -> dict:
    from embodied.vla.model import VLAPolicy

    torch.manual_seed(0)
    obs_dim, text = 60 + 384, [60, 384]
    terms = [[0, 10, 0]] + [[10 + 8 * i, 8, 1] for i in range(4)] + [[42, 6, 2], [48, 6, 2]] + [[54, 6, 3]]
    pi = VLAPolicy(obs_dim, 7, text, head="continuous", terms=terms, state_encoder="pointers").to(device).eval()
    out = {}
    for b in batches:
        x = torch.randn(b, obs_dim, device=device)
        with torch.no_grad():
            for _ in range(5):
                pi(x)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(repeats):
                pi(x)
            _sync(device)
        out[f"b{b}_ms"] = round((time.perf_counter() - t0) / repeats * 1e3, 3)
    return out


def train_wall(device: str, steps: int, timeout_s: float) -> dict:
    """Wall of ``embodied train --task quadrotor-hover`` for ``steps`` env steps on ``device`` (sim and learner), and
    its summary (or the error that ended it)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["embodied", "train", "--task", "quadrotor-hover", "--run-dir", f"{tmp}/r", f"sim_device={device}",
               f"learner_device={device}", f"total_steps={steps}", "log.eval_every=0", "log.progress=false",
               "log.checkpoint_every=0"]
        try:
            summary, wall, _ = run_json(cmd, timeout_s)
        except RuntimeError as e:
            return {"error": str(e)[-300:]}
    return {"wall_s": round(wall, 1), "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--train-steps", type=int, default=20000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    seconds = 0.5 if args.quick else 2.0
    result = {"machine": machine_info(), "torch_threads": torch.get_num_threads(),
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    sizes = {"quadrotor-hover": [1024, 16384, 131072], "pendulum": [1024, 65536], "point-reach": [1024, 65536]}
    if args.quick:
        sizes = {k: v[:1] for k, v in sizes.items()}
    rows = {}
    for task, ns in sizes.items():
        for n in ns:
            row = {d: round(env_rate(task, n, d, seconds)) for d in devices}
            if "cuda" in row:
                row["cuda_over_cpu"] = round(row["cuda"] / row["cpu"], 2)
            rows[f"{task}@{n}"] = row
            print(task, n, row, file=sys.stderr, flush=True)
    result["env_steps_per_s"] = rows
    result["vla_forward"] = {d: vla_forward(d) for d in devices}
    print("vla", result["vla_forward"], file=sys.stderr, flush=True)
    result["train_quadrotor"] = {d: train_wall(d, 2000 if args.quick else args.train_steps, 600) for d in devices}
    emit(result, args.out)


if __name__ == "__main__":
    main()
