"""Resume continues a run exactly (DESIGN.md: "A checkpoint holds everything needed to continue exactly").

(a) In-process: a run trained straight to N steps and a run trained to N/2 then resumed to N end in
    bitwise-identical checkpoints (weights, optimizers, replay buffer, RNG states, env, counters).
(b) Through the CLI: a run SIGKILLed after its first checkpoint keeps an intact checkpoint and metrics
    file, ``train --resume`` finishes it, and the result equals an uninterrupted run of the same config.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from embodied.checkpoint import checkpoint_paths, load_checkpoint
from embodied.config import load_config
from embodied.train import resume, train

WALL_CLOCK_KEYS = {"train_time"}  # seconds measured, not state: differ between any two runs


def flatten(x, prefix: str = "") -> dict[str, object]:
    """Nested dicts/lists of a checkpoint as ``{"algo/pi/net.0.weight": tensor, ...}``."""
    if isinstance(x, dict):
        return {k2: v2 for k, v in x.items() for k2, v2 in flatten(v, f"{prefix}{k}/").items()}
    if isinstance(x, (list, tuple)):
        return {k2: v2 for i, v in enumerate(x) for k2, v2 in flatten(v, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): x}


def differences(a: dict, b: dict, skip=WALL_CLOCK_KEYS) -> list[str]:
    """Paths where two checkpoints differ; tensors compared bitwise (shape, dtype and values)."""
    fa = {k: v for k, v in flatten(a).items() if k.split("/")[0] not in skip}
    fb = {k: v for k, v in flatten(b).items() if k.split("/")[0] not in skip}
    out = [f"{k}: only in {'first' if k in fa else 'second'}" for k in sorted(fa.keys() ^ fb.keys())]
    for k in sorted(fa.keys() & fb.keys()):
        x, y = fa[k], fb[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            same = x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        else:
            same = type(x) is type(y) and x == y
        if not same:
            out.append(f"{k}: {_brief(x)} != {_brief(y)}")
    return out


def _brief(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor{tuple(x.shape)}" if x.numel() > 1 else repr(x.item())
    return repr(x)


@pytest.fixture
def one_thread():
    """Tiny networks on a shared CPU run faster on one thread; restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- (a) in-process exact continuation ----------------------------------------------------------------
QUIET = ["log.progress=false", "log.tensorboard=false", "log.checkpoint_every=1024"]
CASES = {
    # the replay buffer is sized min(buffer_size, total_steps), so resuming to a larger budget grows it
    "sac": ("quadrotor-hover", ["algo=sac"]),
    "sac-fixed-buffer": ("quadrotor-hover", ["algo=sac", "sac.buffer_size=1024"]),
    "td3": ("quadrotor-hover", ["algo=td3"]),
    # two members, each in a process of its own: their state comes through the pipe
    "td3-ensemble": ("quadrotor-hover", ["algo=td3", "ensemble=2"]),
    "ppo": ("pendulum", []),
    # the best evaluated policy so far is state too (log.keep_best)
    "ppo-keep-best": ("pendulum", ["log.keep_best=true", "log.eval_every=512", "log.eval_episodes=8"]),
    # a run that learns its model while training: the model, its optimizer, the real transitions and the
    # imagined rollouts are state too
    # (refits every 384 steps: a checkpoint at 1024 falls between two, so the start states as of the last fit count)
    "wm-dyna": ("wm:pendulum", ["env.warmup=256", "env.refit_every=384", "env.model_envs=16",
                                "env.ensemble.hidden=[32,32]", "env.ensemble.epochs=2",
                                "sac.buffer_size=8192"]),
}


@pytest.mark.parametrize("case", ["sac", "sac-fixed-buffer", "td3", "td3-ensemble", "ppo", "ppo-keep-best",
                                  "wm-dyna"])
def test_resume_matches_uninterrupted_run(tmp_path, one_thread, case):
    task, extra = CASES[case]
    train(load_config(task, "debug", [*QUIET, *extra, "total_steps=2048"]), tmp_path / "A")
    train(load_config(task, "debug", [*QUIET, *extra, "total_steps=1024"]), tmp_path / "B")
    assert [p.name for p in checkpoint_paths(tmp_path / "B")] == ["ckpt_000000001024.pt"]
    resume(tmp_path / "B", total_steps=2048)

    a, b = load_checkpoint(tmp_path / "A"), load_checkpoint(tmp_path / "B")
    assert a["step"] == b["step"] == 2048
    assert sorted(a["algo"]) == sorted(b["algo"])  # same pieces of algorithm state on both sides
    algo = a["algo"]["members"][1] if "members" in a["algo"] else a["algo"]  # an ensemble: its last member's
    assert "generator" in algo and "generator" in a["collector"]["env"]  # RNG states are compared too
    assert "buffer" in algo or task != "quadrotor-hover"
    assert ("imagination" in a) == task.startswith("wm:")
    diff = differences(a, b)
    assert not diff, "resumed run differs from the uninterrupted one:\n" + "\n".join(diff[:40])


def eval_rows(run: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if "eval/return" in r}




def test_resumed_eval_matches_uninterrupted_eval(tmp_path, one_thread):
    # a short curriculum interval makes the eval env's curriculum advance within one debug eval
    extra = [*QUIET, "algo=sac", "sac.buffer_size=1024", "env.curriculum.interval=64"]
    train(load_config("quadrotor-hover", "debug", [*extra, "total_steps=2048"]), tmp_path / "A")
    train(load_config("quadrotor-hover", "debug", [*extra, "total_steps=1024"]), tmp_path / "B")
    resume(tmp_path / "B", total_steps=2048)
    a, b = eval_rows(tmp_path / "A"), eval_rows(tmp_path / "B")
    assert sorted(a) == sorted(b) == [1024, 2048]
    assert a[1024] == b[1024]
    assert not differences(load_checkpoint(tmp_path / "A"), load_checkpoint(tmp_path / "B"))  # training exact
    assert a[2048] == b[2048]


# ---- (b) SIGKILL, then resume through the CLI -----------------------------------------------------------
KILL_TOTAL = 6144
KILL_ARGS = ["--task", "quadrotor-hover", "--preset", "debug", f"total_steps={KILL_TOTAL}",
             "log.checkpoint_every=1024", "log.progress=false", "log.tensorboard=false"]
LOG_EVERY = 256  # configs/debug.yaml


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "embodied.cli", *args]


def cli_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_ok(args: list[str], cwd: Path) -> dict:
    proc = subprocess.run(args, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def kill_after_first_checkpoint(run: Path, cwd: Path, timeout: float = 180) -> None:
    proc = subprocess.Popen(cli("train", "--run-dir", str(run), *KILL_ARGS), cwd=cwd, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not checkpoint_paths(run):  # ckpt_*.pt only: a .pt.tmp being written does not count
            assert proc.poll() is None, f"training ended before its first checkpoint:\n{proc.stderr.read()[-4000:]}"
            assert time.monotonic() < deadline, "no checkpoint within the timeout"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_sigkill_then_resume_continues_exactly(tmp_path):
    killed, full = tmp_path / "killed", tmp_path / "full"
    kill_after_first_checkpoint(killed, tmp_path)

    # what the kill left: every checkpoint file loads, every metrics line is whole JSON
    ckpts = checkpoint_paths(killed)
    assert ckpts and all(torch.load(p, weights_only=False)["step"] > 0 for p in ckpts)
    start = load_checkpoint(killed)  # what resume will continue from: the newest checkpoint
    assert start["step"] % 1024 == 0 and 0 < start["step"] < KILL_TOTAL
    assert ckpts[-1].name == f"ckpt_{start['step']:012d}.pt"
    metrics = (killed / "metrics.jsonl").read_bytes()
    assert metrics.endswith(b"\n")
    assert all("step" in json.loads(line) for line in metrics.splitlines())

    out = run_ok(cli("train", "--resume", str(killed)), tmp_path)
    assert out["step"] == KILL_TOTAL

    final = load_checkpoint(killed)
    assert checkpoint_paths(killed)[-1].name == f"ckpt_{KILL_TOTAL:012d}.pt"
    assert final["step"] == KILL_TOTAL
    assert final["algo"]["num_observed"] == KILL_TOTAL  # env steps the algorithm stored
    assert final["collector"]["env"]["total_env_steps"] == KILL_TOTAL  # env steps the env simulated
    assert final["config"] == start["config"]

    # the killed process's rows after the checkpoint were dropped (MetricsLogger.rewind): the step column
    # never goes backwards, and the resumed process's rows start right after the checkpoint
    rows = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] == KILL_TOTAL
    before_kill = [json.loads(line) for line in metrics.splitlines()]
    assert rows[:len([r for r in before_kill if r["step"] <= start["step"]])] == \
        [r for r in before_kill if r["step"] <= start["step"]]
    new_rows = [r for r in rows if r["step"] > start["step"]]
    assert new_rows and new_rows[0]["step"] <= start["step"] + LOG_EVERY

    # an uninterrupted run of the same config (same seed) ends in the same state, bit for bit
    run_ok(cli("train", "--run-dir", str(full), *KILL_ARGS), tmp_path)
    reference = load_checkpoint(full)
    assert not differences(reference["algo"], final["algo"]), differences(reference["algo"], final["algo"])[:40]
    diff = differences(reference, final)
    assert not diff, "\n".join(diff[:40])

    # and so do the metrics it logged after the checkpoint step (wall-clock columns aside)
    def rows_after(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r["step"] > start["step"]]

    full_rows = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert rows_after(new_rows) == rows_after(full_rows)


def test_keep_best_keeps_the_best_evaluated_policy(tmp_path, one_thread):
    """``log.keep_best``: the checkpoint's policy (what load_policy, eval and export read) is the one of the periodic
    evaluation with the best (success, return), its weights exactly those evaluated; training state stays the
    latest."""
    from embodied.checkpoint import load_policy
    from embodied.evaluate import eval_seed, evaluate, make_eval_env

    # seed 3: the best evaluation is not the last one (1536 of 512..2048)
    common = [*QUIET, "seed=3", "log.eval_every=512", "log.eval_episodes=8", "total_steps=2048"]
    cfg = load_config("pendulum", "debug", [*common, "log.keep_best=true"])
    run, summary = train(cfg, tmp_path / "A")
    rows = eval_rows(run)
    assert sorted(rows) == [512, 1024, 1536, 2048]
    best = max(rows, key=lambda s: (rows[s].get("eval/success", float("-inf")), rows[s]["eval/return"]))
    ckpt = load_checkpoint(run)
    assert ckpt["policy"]["step"] == summary["best_step"] == best and ckpt["step"] == 2048
    assert summary["best/return"] == rows[best]["eval/return"]
    again = evaluate(load_policy(run).act, make_eval_env(cfg, num_envs=8), seed=eval_seed(cfg, best))
    assert again["eval/return"] == pytest.approx(rows[best]["eval/return"], abs=1e-5)
    # training is the same run without it: only the policy the checkpoint names differs (where the best was earlier)
    plain, _ = train(load_config("pendulum", "debug", common), tmp_path / "B")
    other = load_checkpoint(plain)
    assert not differences(ckpt["algo"], other["algo"])
    assert best != 2048 and differences(ckpt["policy"]["state"], other["policy"]["state"])
