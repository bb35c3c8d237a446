"""How much a bounded residual can lift a base policy at all (issue 12's residual-lift diagnosis): on the task, each
env acts ``clip(b + clip(e - b, -limit, limit), -1, 1)``, with ``b`` the frozen base's action and ``e`` the task's
scripted expert's (no noise), for each ``--limits`` value; success over the first episode of each of ``--episodes``
envs (every env counted once: counting the first episodes to finish would favour fast successes). ``limit 0`` is the
base alone. The clipped expert correction is not the best bounded residual (RL may anticipate), but when it stays
far below the goal the bound, not the learner, is the first thing to change.

    python scripts/bench/bench_residual_ceiling.py --base RUN_OR_BUNDLE [--task pick-place] [--limits 0 0.1 0.3 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402


def ceiling(task: str, base: str, limit: float, episodes: int, seed: int, hold_gripper: bool) -> float:
    from embodied import make_env
    from embodied.algos.residual import load_base
    from embodied.evaluate import evaluate
    from embodied.policies import build_policy
    from embodied.policies.chunked import reset_policy
    from embodied.tasks.manipulation.experts import expert

    env = make_env(task, num_envs=episodes, seed=seed)
    spec = load_base(base, env.single_observation_space["policy"].shape[0], env.single_action_space.shape[0])
    policy = build_policy(spec["spec"])
    policy.load_state_dict(spec["state"])
    policy.eval()
    scripted = expert(env, action_noise=0.0, seed=seed)  # restarts its phases where the env starts an episode

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        b = policy.act(obs).double().clamp(-1, 1)
        correction = (scripted(obs).double().clamp(-1, 1) - b).clamp(-limit, limit)
        if hold_gripper:  # corrections of the pose only: the gripper stays the base's
            correction[:, 6] = 0.0
        return (b + correction).clamp(-1, 1).float()

    # each env's first episode counts once (counting the first to finish would favour fast successes)
    return evaluate(act, env, seed, reset=lambda mask: reset_policy(policy, mask))["eval/success"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the frozen base: a run directory or a deploy bundle")
    ap.add_argument("--task", default="pick-place")
    ap.add_argument("--limits", type=float, nargs="*", default=[0.0, 0.1, 0.3, 0.5, 1.0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = {}
    for limit in args.limits:
        rows[str(limit)] = round(ceiling(args.task, args.base, limit, args.episodes, args.seed, False), 4)
        rows[f"{limit} pose only"] = round(ceiling(args.task, args.base, limit, args.episodes, args.seed, True), 4)
        print(f"limit {limit}: {rows[str(limit)]:.3f} (pose only {rows[f'{limit} pose only']:.3f})",
              file=sys.stderr, flush=True)
    emit({"bench": "residual_ceiling", "machine": machine_info(), "task": args.task, "base": args.base,
          "episodes": args.episodes, "seed": args.seed, "success_by_limit": rows}, args.out)


if __name__ == "__main__":
    main()
