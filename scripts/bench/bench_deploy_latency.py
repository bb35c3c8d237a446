"""Policy call latency at batch 1, one thread; prints one JSON object (and writes it with --out).

For an 18-64-64-4 ReLU MLP and for the quadrotor actor (82-128-128-4 equivariant, from ``--run`` or freshly
initialized at the default sizes), each exported with ``write_bundle``:
  torch_eager      ``actor.act(x)`` (no grad), x a [1, obs] tensor
  ort_plain        ``sess.run(None, {"obs": x})``, default session options with intra_op_num_threads=1, numpy
                   float32 input: the peer our runner is held to (<= 1.0x)
  runner_onnx      ``load_bundle(B).act(state)``: the robot's state in, the action out, the history kept
  runner_c_ctypes  ``load_bundle(B, "c").act(state)``: the generated C through ctypes
  c_loop_O2        the generated ``policy_forward`` called 1e6 times in a C loop, ``-O2``
  c_loop_native    the same with ``-O2 -march=native``
  emx_c_loop_O2    (peer, when ``emx-onnx-cgen`` is installed) its C from the same ONNX, same loop and flags;
                   also its object size beside ours
Python-level figures: mean us per call over ``--calls`` calls, the median of 5 repetitions.

Usage: ``python scripts/bench/bench_deploy_latency.py [--run RUN] [--out bench_results/deploy_latency.json]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, exit_on_sigterm, machine_info  # noqa: E402

import embodied  # noqa: E402
from embodied.core.layout import generic_layout  # noqa: E402
from embodied.hardware.bundle import load_bundle, write_bundle  # noqa: E402
from embodied.hardware.codegen import size_report  # noqa: E402
from embodied.policies import DeterministicActor  # noqa: E402

C_MAIN = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
void %(fn)s;
int main(void) {
    static float obs[%(obs)d], act[%(act)d];
    struct timespec t0, t1;
    volatile float sink = 0.0f;
    long k, n = %(n)ld;
    for (k = 0; k < %(obs)d; ++k) obs[k] = 0.01f * (float)k;
    for (k = 0; k < 10000; ++k) %(call)s;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (k = 0; k < n; ++k) { obs[0] = (float)k * 1e-7f; %(call)s; sink += act[0]; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%%.6f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)n / 1e3);
    return sink == 12345.0f;
}
"""


def per_call_us(fn, calls: int, reps: int = 5) -> float:
    for _ in range(min(calls, 2000)):
        fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out)


def c_loop(sources: list[Path], include: Path, decl: str, call: str, obs: int, act: int, flags: list[str],
           workdir: Path, n: int) -> float:
    main = workdir / "bench_main.c"
    main.write_text(C_MAIN % {"fn": decl, "obs": obs, "act": act, "n": n, "call": call})
    exe = workdir / "bench_exe"
    subprocess.run(["gcc", "-std=c99", *flags, "-I", str(include), str(main), *map(str, sources), "-o", str(exe),
                    "-lm"], check=True, capture_output=True)
    return min(float(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
               for _ in range(3))


def emx_peer(onnx_path: Path, workdir: Path, obs: int, act: int, n: int) -> dict:
    tool = shutil.which("emx-onnx-cgen")
    if tool is None:
        return {"available": False}
    import onnx

    model = onnx.load(str(onnx_path))  # batch fixed at 1 (a dynamic batch makes it malloc per call)
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 1
    fixed = workdir / "policy_b1.onnx"
    onnx.save(model, str(fixed))
    out = workdir / "emx_model.c"
    r = subprocess.run([tool, "compile", str(fixed), str(out), "--large-weight-threshold", "0"],
                       capture_output=True, text=True)
    if r.returncode:
        return {"available": True, "error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    src = out.read_text()
    # its entry point: void model(const float obs[restrict 1][N], float action[restrict 1][M])
    res = {"available": True, "source_bytes": len(src), "mallocs": "malloc(" in src}
    try:
        res["c_loop_O2_us"] = c_loop([out], workdir, f"model(const float (*obs)[{obs}], float (*action)[{act}])",
                                     f"model((const float (*)[{obs}])obs, (float (*)[{act}])act)", obs, act,
                                     ["-O2"], workdir, n)
        obj = workdir / "emx.o"
        subprocess.run(["gcc", "-std=c99", "-O2", "-c", str(out), "-o", str(obj)], check=True, capture_output=True)
        res["size"] = size_report(obj)
    except subprocess.CalledProcessError as e:
        res["error"] = (e.stderr.decode() if isinstance(e.stderr, bytes) else str(e.stderr))[-300:]
    return res


def measure(name: str, actor, layout, obs: np.ndarray, workdir: Path, calls: int, c_calls: int) -> dict:
    bdir = workdir / name
    meta = write_bundle(actor, layout, obs, bdir, "all", task=name)
    x_t = torch.from_numpy(obs[:1].copy())
    x_np = obs[:1].copy()
    state = obs[0, : layout.robot_size()].copy()
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(bdir / "policy.onnx"), opts, providers=["CPUExecutionProvider"])
    r_onnx, r_c = load_bundle(bdir, "onnx"), load_bundle(bdir, "c")
    src = [bdir / "policy.c"]
    fwd = ("policy_forward(const float *obs, float *action)", "policy_forward(obs, act)")
    res = {
        "parameters": int(sum(p.numel() for p in actor.parameters())),
        "parity": meta["parity"], "c_size": meta["c"]["size"],
        "torch_eager_us": per_call_us(lambda: actor.act(x_t), calls),
        "ort_plain_us": per_call_us(lambda: sess.run(None, {"obs": x_np}), calls),
        "runner_onnx_us": per_call_us(lambda: r_onnx.act(state), calls),
        "runner_c_ctypes_us": per_call_us(lambda: r_c.act(state), calls),
        "c_loop_O2_us": c_loop(src, bdir, *fwd, obs.shape[1], layout.action_size, ["-O2"], bdir, c_calls),
        "c_loop_native_us": c_loop(src, bdir, *fwd, obs.shape[1], layout.action_size, ["-O2", "-march=native"], bdir,
                                   c_calls),
        "emx_peer": emx_peer(bdir / "policy.onnx", bdir, obs.shape[1], layout.action_size, c_calls),
    }
    res["runner_onnx_vs_ort_plain"] = res["runner_onnx_us"] / res["ort_plain_us"]
    if "c_loop_O2_us" in res["emx_peer"]:
        res["c_loop_O2_vs_emx"] = res["c_loop_O2_us"] / res["emx_peer"]["c_loop_O2_us"]
    return res


def main() -> None:
    exit_on_sigterm()  # a killed bench stops the command it runs
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default=None, help="a quadrotor-hover run whose actor to measure (default: fresh)")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--c-calls", type=int, default=1_000_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    out = {"machine": machine_info(), "calls": args.calls, "c_calls": args.c_calls}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        mlp = DeterministicActor(18, 4, [64, 64], "relu", False).eval()
        obs = rng.normal(0, 1, (1024, 18)).astype(np.float32)
        out["mlp_18_64_64_4"] = measure("mlp", mlp, generic_layout({"policy": (18,)}, (4,), 0.01), obs, work,
                                        args.calls, args.c_calls)
        env = embodied.make_env("quadrotor-hover", num_envs=1024)
        qobs = env.reset(seed=0)[0]["policy"].numpy()
        if args.run:
            actor = embodied.load_policy(args.run).actor
        else:
            actor = DeterministicActor(qobs.shape[1], 4, [128, 128], "relu", False,
                                       group=env.symmetry_group().to_spec()).eval()
        out["quadrotor_actor"] = measure("quadrotor", actor, env.layout(), qobs, work, args.calls, args.c_calls)
        out["quadrotor_actor"]["source"] = args.run or "fresh init (default sizes)"
    emit(out, args.out)


if __name__ == "__main__":
    main()
