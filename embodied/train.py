"""Build a run from a ``RunConfig`` (or resume one) and train it."""

from __future__ import annotations

import time
from pathlib import Path

import torch

import embodied.algos.ppo  # noqa: F401  (registers algorithms)
import embodied.algos.sac  # noqa: F401
import embodied.algos.td3  # noqa: F401
import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.algos.off_policy import OffPolicyAlgorithm
from embodied.checkpoint import load_checkpoint
from embodied.config import RunConfig, config_from_dict, to_yaml
from embodied.core.base import resolve_device
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS, TASKS
from embodied.evaluate import make_eval_env
from embodied.runners import RUNNERS
from embodied.runtime.collector import SyncCollector


def new_run_dir(cfg: RunConfig) -> Path:
    root = Path(cfg.log.run_root) / cfg.task
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / stamp
    i = 1
    while path.exists():  # two runs started in the same second
        path = root / f"{stamp}-{i}"
        i += 1
    path.mkdir(parents=True)
    return path


def build(cfg: RunConfig, run_dir: Path):
    spec = TASKS.get(cfg.task)
    if cfg.torch_threads < 1:
        raise UserError(f"torch_threads must be >= 1, got {cfg.torch_threads}")
    torch.set_num_threads(cfg.torch_threads)
    algo_cls = ALGOS.get(cfg.algo)
    sim_device, learner_device = resolve_device(cfg.sim_device), resolve_device(cfg.learner_device)
    if cfg.num_envs < 1 or cfg.total_steps < 1:
        raise UserError("num_envs and total_steps must be >= 1")
    env = spec.make(cfg.env, num_envs=cfg.num_envs, device=sim_device, seed=cfg.seed)
    algo_cfg = getattr(cfg, cfg.algo)
    if cfg.policy.symmetrize and cfg.algo == "ppo":
        raise UserError("policy.symmetrize is implemented for the off-policy learners (td3, sac), not ppo; "
                        "add policy.symmetrize=false")
    extra = {"symmetry": env.symmetry_group()} if issubclass(algo_cls, OffPolicyAlgorithm) else {}
    algo = algo_cls(algo_cfg, cfg.policy, env.single_observation_space, env.single_action_space, cfg.num_envs,
                    learner_device, cfg.seed, total_steps=cfg.total_steps, **extra)
    collector = SyncCollector(env, learner_device)

    return RUNNERS[cfg.algo](cfg, collector, algo, lambda: make_eval_env(cfg, cfg.log.eval_episodes), run_dir)


def train(cfg: RunConfig, run_dir: Path | None = None) -> tuple[Path, dict]:
    """Start a new run; returns its directory and a summary."""
    torch.manual_seed(cfg.seed)
    run_dir = Path(run_dir) if run_dir else new_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = build(cfg, run_dir)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir, runner.train()


def resume(run_dir: Path, total_steps: int | None = None) -> tuple[Path, dict]:
    """Continue a run exactly from its latest checkpoint (``total_steps`` may extend it)."""
    ckpt = load_checkpoint(run_dir)
    cfg = config_from_dict(ckpt["config"])
    if total_steps is not None:
        cfg.total_steps = total_steps
    runner = build(cfg, Path(run_dir))
    runner.restore(ckpt)
    return Path(run_dir), runner.train()
