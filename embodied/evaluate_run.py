"""``embodied eval``: success rate and mean return of a trained run, and an optional video."""

from __future__ import annotations

from pathlib import Path

import torch

import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.checkpoint import load_checkpoint, policy_from_checkpoint
from embodied.config import config_from_dict
from embodied.core.errors import UserError
from embodied.evaluate import eval_seed, evaluate, make_eval_env
from embodied.render import write_video


def evaluate_run(run_dir: Path, episodes: int = 100, video: bool = False, seed: int | None = None) -> dict:
    ckpt = load_checkpoint(run_dir)
    cfg = config_from_dict(ckpt["config"])
    policy = policy_from_checkpoint(ckpt, run_dir)  # one read of the checkpoint (a full one holds the replay)
    seed = eval_seed(cfg) if seed is None else seed
    env = make_eval_env(cfg, num_envs=episodes)
    if video:  # before the evaluation, not after it
        _check_renders(env, cfg.task)
    result = {"task": cfg.task, "step": ckpt["step"], "episodes": episodes,
              **evaluate(policy.act, env, seed=seed, reset=policy.reset)}
    if video:
        result["video"] = str(record_video(policy, cfg, Path(run_dir) / "videos", seed))
    return result


def _check_renders(env, task: str) -> None:
    if not env.can_render:
        raise UserError(f"task {task!r} has no renderer; run eval without --video")


@torch.no_grad()
def record_video(policy, cfg, out_dir: Path, seed: int, fps: int = 25) -> Path:
    """Roll out one episode and draw every ``round(1 / (fps * control_dt))``-th control step (real-time
    playback)."""
    env = make_eval_env(cfg, num_envs=1, device="cpu")
    _check_renders(env, cfg.task)
    obs, _ = env.reset(seed=seed)
    policy.reset()
    dt = env.control_dt
    every = max(1, round(1.0 / (fps * dt)))
    frames = []
    for t in range(env.max_episode_steps):
        if t % every == 0:
            frames.append(env.render_frame())
        obs, _, terminated, truncated, _ = env.step(policy.act(obs["policy"]))
        if bool(terminated[0] or truncated[0]):
            break
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_video(frames, out_dir / f"{cfg.task}_seed{seed}.mp4", fps=round(1.0 / (every * dt)))
