"""Where a pick-place policy fails (issue 12's residual lift diagnosis): the run's policy (``load_policy``) on the
first episode of each of ``--episodes`` envs (``embodied eval``'s starts), each episode classed by the cube's path:
``success``, ``never lifted`` (the cube never rose 1 cm: the grasp missed and was not retried), ``over the plate``
(it ended above the plate, not resting on it) or ``lifted, not placed`` (lifted, then dropped or carried elsewhere).
Prints one JSON per run.

    python scripts/bench/bench_pick_failures.py RUN [RUN ...] [--episodes 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402


@torch.no_grad()
def classify(run: Path, episodes: int) -> dict:
    from embodied.checkpoint import load_checkpoint, policy_from_checkpoint
    from embodied.config import config_from_dict
    from embodied.evaluate import eval_seed, make_eval_env
    from embodied.tasks.manipulation.tabletop import CUBE, PickPlaceEnv

    ckpt = load_checkpoint(run)
    cfg = config_from_dict(ckpt["config"])
    policy = policy_from_checkpoint(ckpt, run)
    env = make_eval_env(cfg, num_envs=episodes)
    if not isinstance(env, PickPlaceEnv):
        raise SystemExit(f"{run}: a pick-place run is needed, this one is {cfg.task}")
    obs, _ = env.reset(seed=eval_seed(cfg))
    policy.reset()
    n = episodes
    done = torch.zeros(n, dtype=torch.bool)
    success = torch.zeros(n, dtype=torch.bool)
    lifted = torch.zeros(n, dtype=torch.bool)
    over = torch.zeros(n, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        pos, _ = env.object_pose()
        live = ~done
        lifted[live] |= pos[live, 2] > CUBE + 0.01
        near = ((pos[:, :2] - env.goal[:, :2]).abs() < env.PLATE[0]).all(1)
        obs, _, terminated, truncated, info = env.step(policy.act(obs["policy"]))
        ended = (terminated | truncated) & ~done
        policy.reset(terminated | truncated)
        final = info.get("final_info") or {}
        if bool(ended.any()):
            if "success" in final:
                success[ended] = final["success"][ended].bool()
            over[ended] = near[ended]
        done |= ended
        if bool(done.all()):
            break
    classes = {"success": success, "never lifted": ~success & ~lifted, "over the plate": ~success & lifted & over,
               "lifted, not placed": ~success & lifted & ~over}
    return {"run": str(run), "task": cfg.task, "step": int(ckpt["step"]), "episodes": n,
            **{k: int(v.sum()) for k, v in classes.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--episodes", type=int, default=100)
    args = ap.parse_args()
    emit({"bench": "pick_failures", "machine": machine_info(),
          "runs": [classify(Path(r), args.episodes) for r in args.runs]}, None)


if __name__ == "__main__":
    main()
