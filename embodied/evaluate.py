"""Evaluation: one episode from each of ``num_episodes`` random initial states, batched."""

from __future__ import annotations

import torch

from embodied.core.base import VecEnv


def eval_env_config(spec, env_cfg):
    """The task config evaluation runs with (see ``TaskSpec.eval_config``)."""
    return spec.eval_config(env_cfg) if spec.eval_config else env_cfg


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
