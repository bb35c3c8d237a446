"""Forward latency of the VLA policy (issue 13) at batch 1 and 64, in torch and in onnxruntime (the exported action
path, instruction as its own input), for its three inputs: state (mini-libero's object state), pixels through the
FiLM CNN, pixels through the tiny ViT (agentview + wrist, 64x64). Parameter counts beside. Goal: <= 5 ms at batch 1
on 2 cores. Medians of ``--repeats`` calls after a warm-up.

    python scripts/bench/bench_vla_policy.py [--threads 2] [--out bench_results/vla_policy.json]"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402

STATE, OBJECTS, TEXT, SIZE = 10, 26, 384, 64


def median_ms(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e3 * sorted(times)[len(times) // 2], 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default="bench_results/vla_policy.json")
    args = ap.parse_args()
    import numpy as np
    import onnxruntime as ort
    import torch

    from embodied.vla.export import export_onnx, split_instruction
    from embodied.vla.model import VLAPolicy

    torch.set_num_threads(args.threads)
    variants = {
        "state": dict(obs_dim=STATE + OBJECTS + TEXT, text=[STATE + OBJECTS, TEXT]),
        "pixels_cnn": dict(obs_dim=STATE + 6 * SIZE * SIZE + TEXT, text=[STATE + 6 * SIZE * SIZE, TEXT],
                           image=[STATE, 6, SIZE, SIZE], vision="cnn"),
        "pixels_vit": dict(obs_dim=STATE + 6 * SIZE * SIZE + TEXT, text=[STATE + 6 * SIZE * SIZE, TEXT],
                           image=[STATE, 6, SIZE, SIZE], vision="vit"),
    }
    rows = []
    for name, kw in variants.items():
        torch.manual_seed(0)
        policy = VLAPolicy(act_dim=7, **kw).eval()
        row = {"variant": name, "parameters": sum(p.numel() for p in policy.parameters())}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "policy.onnx"
            export_onnx(policy, kw["text"], kw["obs_dim"], path)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            for b in (1, 64):
                x = torch.rand(b, kw["obs_dim"])
                with torch.no_grad():
                    row[f"torch_ms_b{b}"] = median_ms(lambda x=x, p=policy: p(x), args.repeats)
                    ref = policy(x).numpy()
                o, t = split_instruction(x.numpy(), kw["text"])
                feeds = {"obs": o, "instruction": t}
                row[f"onnxruntime_ms_b{b}"] = median_ms(lambda feeds=feeds, s=sess: s.run(None, feeds), args.repeats)
                row[f"parity_b{b}"] = float(np.abs(sess.run(None, feeds)[0] - ref).max())
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    emit({"benchmark": "vla_policy", "machine": machine_info(), "threads": args.threads, "rows": rows,
          "goal": "<= 5 ms at batch 1 on 2 cores"}, args.out)


if __name__ == "__main__":
    main()
