"""Milliseconds per TD3 gradient step of quadrotor-hover's default learner (the ~70% of `embodied train --task
quadrotor-hover`'s wall that is learning), one thread, beside Stable-Baselines3 TD3's `train()` at the same sizes
in the same run; prints one JSON object.

  ours          the run's own learner as `embodied train` builds it (equivariant 128x128 actor, twin 64x64 critics on
                the privileged observation, symmetry-augmented replay, 3-step rows, delayed actor steps), its replay
                filled by ``--fill`` env steps of the real task; then ``--updates`` timed gradient steps: the numba
                kernel (``td3.kernel``) on the preset's two threads (``td3.kernel_threads``)
  ours_1thread  the same on one thread
  ours_torch    the same through the torch step (``td3.kernel=torch``, the reference), one thread
  ours_plain    the same with a plain actor and no augmentation (``policy.symmetrize=false
                td3.symmetry_augmentation=false``): what the symmetry costs per step
  sb3_td3       SB3 TD3, actor 128x128 and critics 64x64 (relu), batch 256, policy delay 2, on the policy
                observation's width (its critics see what the actor sees), replay filled with random rows;
                (``--fill`` of them); ``model.train(gradient_steps=U)`` timed

    python scripts/bench/bench_td3_update.py [--updates 3000] [--fill 20000] [--out FILE]"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread everywhere, before torch loads
sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402


def ours(overrides: list[str], fill: int, updates: int) -> dict:
    import torch

    from embodied.config import load_config
    from embodied.train import build

    cfg = load_config("quadrotor-hover", None, ["log.progress=false", "torch_threads=1", *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        runner = build(cfg, Path(tmp))
        torch.set_num_threads(1)
        algo = runner.algo
        runner.start()
        while runner.step < fill:
            runner.collect()
        for _ in range(min(200, updates)):  # warm-up (the actor's first steps included)
            algo._gradient_step()
        t0 = time.perf_counter()
        for _ in range(updates):
            algo._gradient_step()
        ms = (time.perf_counter() - t0) / updates * 1e3
        obs_dim = runner.collector.single_observation_space["policy"].shape[0]
        runner.collector.close()
    return {"ms_per_update": round(ms, 3), "overrides": overrides, "policy_obs_dim": obs_dim}


def sb3_td3(obs_dim: int, act_dim: int, rows: int, updates: int) -> dict:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import TD3

    torch.set_num_threads(1)

    class Blank(gym.Env):  # only the spaces matter: train() reads the replay buffer
        observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)

        def reset(self, *, seed=None, options=None):
            return np.zeros(obs_dim, np.float32), {}

        def step(self, action):
            return np.zeros(obs_dim, np.float32), 0.0, False, False, {}

    model = TD3("MlpPolicy", Blank(), batch_size=256, learning_rate=1e-3, tau=0.01, policy_delay=2, device="cpu",
                policy_kwargs={"net_arch": {"pi": [128, 128], "qf": [64, 64]}, "activation_fn": torch.nn.ReLU},
                seed=0)
    rng = np.random.default_rng(0)
    for _ in range(max(1, rows // 1000)):
        o = rng.standard_normal((1000, 1, obs_dim)).astype(np.float32)
        a = rng.uniform(-1, 1, (1000, 1, act_dim)).astype(np.float32)
        for i in range(1000):
            model.replay_buffer.add(o[i], o[i], a[i], np.zeros(1, np.float32), np.zeros(1, bool), [{}])
    model._setup_learn(1, None)  # the logger train() writes to
    model.train(gradient_steps=min(200, updates), batch_size=256)
    t0 = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=256)
    return {"ms_per_update": round((time.perf_counter() - t0) / updates * 1e3, 3), "obs_dim": obs_dim}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--fill", type=int, default=20_000)
    ap.add_argument("--out")
    args = ap.parse_args()
    result = {"benchmark": "td3_update", "machine": machine_info(), "updates": args.updates}
    result["ours"] = ours([], args.fill, args.updates)
    result["ours_1thread"] = ours(["td3.kernel_threads=1"], args.fill, args.updates)
    result["ours_torch"] = ours(["td3.kernel=torch"], args.fill, args.updates)
    result["ours_plain"] = ours(["policy.symmetrize=false", "td3.symmetry_augmentation=false"], args.fill,
                                args.updates)
    result["sb3_td3"] = sb3_td3(result["ours"]["policy_obs_dim"], 4, args.fill, args.updates)
    sb3 = result["sb3_td3"]["ms_per_update"]
    result["ours_over_sb3"] = round(result["ours"]["ms_per_update"] / sb3, 3)
    result["ours_1thread_over_sb3"] = round(result["ours_1thread"]["ms_per_update"] / sb3, 3)  # both on one thread
    result["kernel_over_torch_1thread"] = round(result["ours_1thread"]["ms_per_update"]
                                                / result["ours_torch"]["ms_per_update"], 3)
    emit(result, args.out)


if __name__ == "__main__":
    main()
