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


def parse_env_settings(items, what: str, names=None) -> dict:
    """Task settings ``env.KEY=VALUE`` (values as YAML) as ``{KEY: value}``; ``names``: the keys allowed."""
    import yaml

    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("env.") or (names is not None and key[4:] not in names):
            known = f" (keys: {', '.join(sorted(names))})" if names is not None else ""
            raise UserError(f"{what} takes task settings env.KEY=VALUE; got {item!r}{known}")
        out[key[4:]] = yaml.safe_load(value)
    return out


def apply_env_overrides(cfg, overrides) -> None:
    """Set task settings ``env.KEY=VALUE`` on a run's config (evaluation under other conditions)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cfg.env)}
    for key, value in parse_env_settings(overrides, "eval", names).items():
        setattr(cfg.env, key, value)


def evaluate_run(run_dir: Path, episodes: int = 100, video: bool = False, seed: int | None = None,
                 env_overrides=()) -> dict:
    ckpt = load_checkpoint(run_dir)
    cfg = config_from_dict(ckpt["config"])
    apply_env_overrides(cfg, env_overrides)
    policy = policy_from_checkpoint(ckpt, run_dir)  # one read of the checkpoint (a full one holds the replay)
    seed = eval_seed(cfg) if seed is None else seed
    env = make_eval_env(cfg, num_envs=episodes)
    _check_inputs(ckpt, env, run_dir)
    if video:  # before the evaluation, not after it
        _check_renders(env, cfg.task)
    result = {"task": cfg.task, "step": ckpt["step"], "episodes": episodes,
              **evaluate(policy.act, env, seed=seed, reset=policy.reset)}
    if video:
        result["video"] = str(record_video(policy, cfg, Path(run_dir) / "videos", seed))
    return result


def _check_inputs(ckpt: dict, env, run_dir) -> None:
    """The run's policy reads as many observation entries as its task gives now (one line where not: a run of an
    older version whose task has changed its observation)."""
    want = ckpt["policy"]["spec"].get("kwargs", {}).get("obs_dim")
    have = env.single_observation_space["policy"].shape
    if want is not None and have and len(have) == 1 and int(want) != int(have[0]):
        raise UserError(f"the policy of {run_dir} reads {want} observation entries; task {ckpt['config']['task']} "
                        f"gives {have[0]} with the run's settings (a run of another version of the task?)")


def _check_renders(env, task: str) -> None:
    if not env.can_render:
        raise UserError(f"task {task!r} has no renderer; run eval without --video")


@torch.no_grad()
def record_video(policy, cfg, out_dir: Path, seed: int, fps: int = 25) -> Path:
    """Roll out one episode and draw every ``round(1 / (fps * control_dt))``-th control step (real-time
    playback)."""
    env = make_eval_env(cfg, num_envs=1, device="cpu")
    _check_renders(env, cfg.task)
    obs, info = env.reset(seed=seed)
    policy.reset()
    dt = env.control_dt
    every = max(1, round(1.0 / (fps * dt)))
    frames = []
    instruction = (info.get("instruction") or [None])[0]  # a language task's: written on every frame
    for t in range(env.max_episode_steps):
        if t % every == 0:
            frames.append(caption(env.render_frame(), instruction) if instruction else env.render_frame())
        obs, _, terminated, truncated, _ = env.step(policy.act(obs["policy"]))
        if bool(terminated[0] or truncated[0]):
            break
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_video(frames, out_dir / f"{cfg.task}_seed{seed}.mp4", fps=round(1.0 / (every * dt)))


def caption(frame, text: str):
    """``frame`` (uint8 ``[H, W, 3]``) with ``text`` written along its top on a dark band, wrapped to its width."""
    import cv2
    import numpy as np

    frame = np.ascontiguousarray(frame)
    h, w = frame.shape[:2]
    scale = max(0.35, w / 900)
    thick = 1
    words, lines, line = text.split(), [], ""
    for word in words:  # wrap at the frame's width
        trial = f"{line} {word}".strip()
        if cv2.getTextSize(trial, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][0] > w - 8 and line:
            lines.append(line)
            line = word
        else:
            line = trial
    lines.append(line)
    step = int(cv2.getTextSize("Ag", cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][1] * 1.8) + 2
    band = min(h, step * len(lines) + 4)
    frame[:band] = (frame[:band] * 0.35).astype(np.uint8)
    for i, ln in enumerate(lines):
        cv2.putText(frame, ln, (4, step * (i + 1) - 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), thick,
                    cv2.LINE_AA)
    return frame
