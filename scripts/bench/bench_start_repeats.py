"""Are a sampling policy's failures luck or its starts (issue 13)? The run's policy (``load_policy``; one that samples
its actions, e.g. filtered-bc's ``sampled_policy``) plays the first episode of each of ``--episodes`` envs from
``embodied eval``'s starts, ``--repeats`` times, its noise reseeded each time (the starts the same). Per start the
number of repeats that succeeded; their histogram beside the binomial one at the same mean success (what failures
by independent luck would give), the share of the failures on starts that never succeeded (systematic ones), and per
task the starts that never / always succeeded. Prints one JSON per run.

    python scripts/bench/bench_start_repeats.py RUN [RUN ...] [--episodes 130] [--repeats 6]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, first_episodes, machine_info  # noqa: E402


def binomial(n: int, repeats: int, p: float) -> list[float]:
    """Expected number of ``n`` starts with 0..repeats successes when every episode succeeds with ``p`` alone."""
    return [n * math.comb(repeats, j) * p ** j * (1 - p) ** (repeats - j) for j in range(repeats + 1)]


@torch.no_grad()
def repeats_of(run: Path, episodes: int, repeats: int) -> dict:
    from embodied.checkpoint import load_checkpoint, policy_from_checkpoint
    from embodied.config import config_from_dict
    from embodied.evaluate import eval_seed, make_eval_env

    ckpt = load_checkpoint(run)
    cfg = config_from_dict(ckpt["config"])
    policy = policy_from_checkpoint(ckpt, run)
    sampler = next((m for m in policy.modules() if isinstance(getattr(m, "generator", None), torch.Generator)
                    and hasattr(m, "seed")), None)
    if sampler is None:
        raise SystemExit(f"{run}: its policy acts deterministically (no seeded noise): every repeat would be the same")
    env = make_eval_env(cfg, num_envs=episodes)
    seed = eval_seed(cfg)
    wins = []
    for r in range(repeats):
        sampler.seed = 1_000 + r  # reseeded at the episodes' start (its reset)
        wins.append(first_episodes(env, policy, seed))
    env.reset(seed=seed)  # the starts' tasks, where the task reports them
    task = getattr(env, "task_id", None)
    k = torch.stack(wins).sum(0)  # [episodes]: successes per start
    p = float(k.sum()) / (episodes * repeats)
    failures = episodes * repeats - int(k.sum())
    out = {"run": str(run), "task": cfg.task, "step": int(ckpt["step"]), "episodes": episodes, "repeats": repeats,
           "success": p, "per_repeat": (torch.stack(wins).float().mean(1)).tolist(),
           "starts_by_successes": torch.bincount(k, minlength=repeats + 1).tolist(),
           "binomial_at_the_mean": [round(b, 1) for b in binomial(episodes, repeats, p)],
           "failures_on_never_won_starts": int((k == 0).sum()) * repeats / failures if failures else 0.0}
    if task is not None and hasattr(env, "task_names"):
        out["per_task"] = {name: {"starts": int((task == i).sum()), "never": int(((task == i) & (k == 0)).sum()),
                                  "always": int(((task == i) & (k == repeats)).sum()),
                                  "success": float(k[task == i].sum()) / max(int((task == i).sum()) * repeats, 1)}
                           for i, name in enumerate(env.task_names)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--episodes", type=int, default=130)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    if args.episodes < 1 or args.repeats < 2:
        raise SystemExit("--episodes >= 1 and --repeats >= 2")
    emit({"bench": "start_repeats", "machine": machine_info(),
          "runs": [repeats_of(Path(r), args.episodes, args.repeats) for r in args.runs]}, None)


if __name__ == "__main__":
    main()
