"""What every benchmark JSON records about the machine and the libraries that produced it."""

from __future__ import annotations

import os
import platform
import sys


def machine_info() -> dict:
    import mujoco
    import torch

    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "mujoco": mujoco.__version__, "torch": torch.__version__}


def emit(result: dict, out: str | None) -> None:
    """Print a benchmark's JSON on stdout and, with ``out``, write it there too."""
    import json
    from pathlib import Path

    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)


def rate(step, n: int, seconds: float) -> float:
    """Items per second of ``step()`` (one call handles ``n``: a batched env step, a rollout), after a warm-up of
    three calls, over at least ``seconds`` and five calls."""
    import time

    for _ in range(3):
        step()
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or calls < 5:
        step()
        calls += 1
    return calls * n / elapsed


def exit_on_sigterm() -> None:
    """SIGTERM (``kill``, ``pkill``) raises SystemExit in the main thread, so ``subprocess.run`` kills the command it
    waits on before the bench exits: by default the bench would die at once and leave its ``embodied train`` child
    running, unseen, beside the next benchmark. ``run_json`` calls it; a bench that runs commands with ``subprocess``
    itself calls it first in its ``main``."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_json(cmd: list[str], timeout_s: float) -> tuple[dict, float, str]:
    """Run an ``embodied`` command; its last stdout line (a JSON object), its wall-clock [s] and its stderr. A failed
    command raises with its last stderr line."""
    import json
    import subprocess
    import time

    exit_on_sigterm()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall, proc.stderr


def first_episodes(env, policy, seed: int, watch=None, ended=None):
    """Run every env's first episode from ``seed`` with the policy; ``watch(live, obs, action)`` sees the state, the
    observation and the policy's action before each step (``live``: the envs whose first episode goes on),
    ``ended(mask, terminated)`` the envs whose first episode just ended and the step's ``terminated``.
    Returns which first episodes succeeded (``[N]`` bool)."""
    import torch

    n = env.num_envs
    obs, _ = env.reset(seed=seed)
    policy.reset()
    done, success = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        action = policy.act(obs["policy"])
        if watch is not None:
            watch(~done, obs, action)
        obs, _, terminated, truncated, info = env.step(action)
        now = (terminated | truncated) & ~done
        policy.reset(terminated | truncated)
        final = info.get("final_info") or {}
        if bool(now.any()):
            if "success" in final:
                success[now] = final["success"][now].bool()
            if ended is not None:
                ended(now, terminated)
        done |= now
        if bool(done.all()):
            break
    return success
