"""Evaluation: one episode from each of ``num_episodes`` random initial states, batched."""

from __future__ import annotations

import torch

from embodied.core.base import VecEnv
from embodied.core.registry import TASKS

EVAL_SEED_OFFSET = 10_000  # eval envs draw initial states from a stream the training never sees


def eval_seed(cfg) -> int:
    """Initial-state seed of a run's evaluations."""
    return cfg.seed + EVAL_SEED_OFFSET


def make_eval_env(cfg, num_envs: int, device=None) -> VecEnv:
    """The env a run is evaluated on: the task config as ``TaskSpec.eval_config`` derives it (e.g. a
    frozen curriculum), ``num_envs`` episodes at a time, on the run's sim device unless given."""
    spec = TASKS.get(cfg.task)
    env_cfg = spec.eval_config(cfg.env) if spec.eval_config else cfg.env
    return spec.make(env_cfg, num_envs=num_envs, device=device or cfg.sim_device, seed=cfg.seed + 1)


@torch.no_grad()
def evaluate(act, env: VecEnv, seed: int, learner_device: torch.device | str = "cpu") -> dict[str, float]:
    """Run the first episode of every env of ``env`` with deterministic ``act(obs_policy)``.

    Returns ``eval/return``, ``eval/length`` and, where the task reports it, ``eval/success``
    (fraction of episodes that succeeded)."""
    n = env.num_envs
    obs, _ = env.reset(seed=seed)
    done = torch.zeros(n, dtype=torch.bool, device=env.device)
    ret = torch.zeros(n, device=env.device)
    length = torch.zeros(n, device=env.device)
    outcome: dict[str, torch.Tensor] = {}
    for _ in range(env.max_episode_steps):
        action = act(obs["policy"].to(learner_device)).to(env.device)
        obs, reward, terminated, truncated, info = env.step(action)
        live = ~done
        ret += reward * live
        length += live.float()
        finished = (terminated | truncated) & live
        for k, v in info.get("final_info", {}).items():
            outcome.setdefault(k, torch.zeros(n, device=env.device))
            outcome[k] = torch.where(finished, v, outcome[k])
        done |= finished
        if bool(done.all()):
            break
    out = {"eval/return": ret.mean().item(), "eval/length": length.mean().item()}
    out.update({f"eval/{k}": v.mean().item() for k, v in outcome.items()})
    return out
