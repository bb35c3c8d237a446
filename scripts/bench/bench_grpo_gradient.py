"""How much signal one GRPO update holds at a policy (issue 13: why RL from the mini-libero clone does not lift it).

GRPO's gradient of its clipped surrogate (at the policy that collected the rollouts: ratio 1) from ``--batches``
independent batches, each ``--rollouts`` rollouts of ``num_envs`` episodes (groups of ``grpo.group_size`` from one
shared start; dynamic sampling keeps the mixed groups), collected by the run's own on-policy runner
(``embodied train algo=grpo init=RUN`` with the given settings, no update made). Reported: the cosine between every
two batches' gradients, over the whole policy and per top-level module, with each module's share of the gradient's
norm, and the batch success rates. With independent noise, a mean cosine ``c`` between batches of ``m`` mixed groups
says the signal-to-noise power ratio of one batch is ``c / (1 - c)``; a batch ``(1 - c) / c`` times larger has
cosine 0.5 (``batch_multiple_for_cosine_half``).

    python scripts/bench/bench_grpo_gradient.py --init RUN [--task mini-libero] [--batches 4] [--rollouts 2]
        [--set grpo.temperature=1.0 num_envs=64 ...] [--out PATH]"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import emit, machine_info  # noqa: E402


def cosines(grads: list[torch.Tensor], mask: torch.Tensor | None = None) -> list[float]:
    pick = (lambda g: g) if mask is None else (lambda g: g[mask])
    return [round(float(torch.nn.functional.cosine_similarity(pick(a), pick(b), 0)), 4)
            for a, b in itertools.combinations(grads, 2)]


def module_masks(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Per top-level module (or parameter) of ``policy``: which entries of the flattened gradient are its."""
    sizes = [(name.split(".")[0], p.numel()) for name, p in policy.named_parameters()]
    total = sum(n for _, n in sizes)
    masks: dict[str, torch.Tensor] = {}
    at = 0
    for name, n in sizes:
        masks.setdefault(name, torch.zeros(total, dtype=torch.bool))[at:at + n] = True
        at += n
    return masks


def main() -> None:
    from embodied.config import load_config
    from embodied.train import build

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", required=True, help="the run whose policy is measured (init=RUN)")
    ap.add_argument("--task", default="mini-libero")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=2, help="rollouts per batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="run settings (grpo.*, num_envs, env.*)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.batches < 2 or args.rollouts < 1:
        raise SystemExit("--batches >= 2 and --rollouts >= 1")
    cfg = load_config(args.task, None, ["algo=grpo", f"init={args.init}", f"seed={args.seed}", "log.progress=false",
                                        "log.tensorboard=false", *args.set])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runner = build(cfg, Path(tmp))
        algo = runner.algo
        try:
            runner.start()
            grads, batches = [], []
            for b in range(args.batches):
                success = []
                for _ in range(args.rollouts):
                    runner.collect_rollout()
                    success.append(algo.close_rollout()["grpo/rollout_success"])
                grad, mixed = algo.surrogate_gradient()
                grads.append(grad)
                batches.append({"mixed_groups": mixed, "success": round(sum(success) / len(success), 4)})
                print(f"batch {b}: {batches[-1]}", file=sys.stderr, flush=True)
            steps = runner.step
        finally:
            runner.collector.close()
    whole = cosines(grads)
    c = sum(whole) / len(whole)
    per_module = {}
    for name, mask in module_masks(algo.actor()).items():
        cs = cosines(grads, mask)
        share = sum(float(g[mask].norm() / g.norm().clamp_min(1e-30)) for g in grads) / len(grads)
        per_module[name] = {"cosine_mean": round(sum(cs) / len(cs), 4), "norm_share": round(share, 4)}
    emit({"benchmark": "grpo_gradient", "machine": machine_info(), "init": args.init, "task": args.task,
          "settings": args.set, "episodes_per_batch": args.rollouts * cfg.num_envs, "batches": batches,
          "cosine": whole, "cosine_mean": round(c, 4),
          "batch_multiple_for_cosine_half": round((1 - c) / c, 1) if c > 0 else None,
          "per_module": per_module, "env_steps": steps, "wall_s": round(time.perf_counter() - t0, 1)}, args.out)


if __name__ == "__main__":
    main()
