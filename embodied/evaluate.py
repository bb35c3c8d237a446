"""Evaluation: one episode from each of ``num_episodes`` random initial states, batched."""

from __future__ import annotations

import torch

from embodied.core.base import INSTRUCTED, TASK_ID, VecEnv
from embodied.core.registry import TASKS
from embodied.runtime.base import EpisodeStats

EVAL_SEED_OFFSET = 10_000  # eval envs draw initial states from a stream the training never sees


def eval_seed(cfg, step: int | None = None, repeat: int = 0) -> int:
    """Initial-state seed of a run's evaluations: ``embodied eval``'s default, and with ``step`` the one of
    the evaluation a run makes at that step (``repeat`` > 0: the stop rule's checks of the same policy at that
    step, ``stop_confirm=now``). Each evaluation draws its own starts: on one fixed set, the first policy that
    happens to fly that set well would stop the run (the stop rule's two passes in a row are then not two
    samples), and its success on starts it never saw is lower (issue 8 note)."""
    if step is None:
        return cfg.seed + EVAL_SEED_OFFSET
    import numpy as np

    key = [cfg.seed, EVAL_SEED_OFFSET, step] + ([repeat] if repeat else [])
    return int(np.random.SeedSequence(key).generate_state(1)[0])


def make_eval_env(cfg, num_envs: int, device=None) -> VecEnv:
    """The env a run is evaluated on: the task config as ``TaskSpec.eval_config`` derives it (e.g. a
    frozen curriculum), ``num_envs`` episodes at a time, on the run's sim device unless given."""
    task, env_cfg = source_task(cfg)
    spec = TASKS.get(task)
    env_cfg = spec.eval_config(env_cfg) if spec.eval_config else env_cfg
    return TaskEnvFactory(task, env_cfg, device or cfg.sim_device)(num_envs, cfg.seed + 1)


def source_task(cfg) -> tuple[str, object]:
    """The real task a run is evaluated (and deployed) on, with its config: the run's own task, or for a task
    learned from another (``wm:<task>``, ``TaskSpec.source``) that one."""
    spec = TASKS.get(cfg.task)
    return spec.source(cfg.env) if spec.source is not None else (cfg.task, cfg.env)


class TaskEnvFactory:
    """``make_env(num_envs, seed)`` for a run's task on ``device``: a picklable factory (worker
    processes and Ray actors build their envs from it)."""

    def __init__(self, task: str, env_cfg, device):
        self.task, self.env_cfg, self.device = task, env_cfg, str(device)

    def __call__(self, num_envs: int, seed: int) -> VecEnv:
        import embodied.tasks  # noqa: F401  (a fresh worker process registers the tasks)

        return TASKS.get(self.task).make(self.env_cfg, num_envs=num_envs, device=self.device, seed=seed)


def make_train_env_factory(cfg, device=None) -> TaskEnvFactory:
    return TaskEnvFactory(cfg.task, cfg.env, device or cfg.sim_device)


@torch.no_grad()
def evaluate(act, env: VecEnv, seed: int, learner_device: torch.device | str = "cpu",
             reset=None) -> dict[str, float]:
    """Run the first episode of every env of ``env`` with deterministic ``act(obs_policy)``; ``reset(mask)`` (a
    policy with per-env state, such as a chunk queue) is told which envs start a new episode.

    Returns ``eval/return``, ``eval/length`` and, where the task reports it, ``eval/success``
    (fraction of episodes that succeeded), means over the episodes, and ``eval/return_std`` (their
    spread: the noise of an evaluation is ``return_std / sqrt(num_envs)``)."""
    n = env.num_envs
    obs, _ = env.reset(seed=seed)
    stats = EpisodeStats(n, env.device)
    done = torch.zeros(n, dtype=torch.bool, device=env.device)
    first = {"return": torch.zeros(n, device=env.device), "length": torch.zeros(n, device=env.device)}
    if reset is not None:
        reset(None)
    for _ in range(env.max_episode_steps):
        action = act(obs["policy"].to(learner_device)).to(env.device)
        obs, reward, terminated, truncated, info = env.step(action)
        if reset is not None:
            reset((terminated | truncated).to(learner_device))
        ended = stats.track(reward, terminated | truncated, info.get("final_info"))
        if ended is None:
            continue
        keep = ~done[ended.env_ids]  # only each env's first episode counts
        ids = ended.env_ids[keep]
        for key, value in (("return", ended.returns), ("length", ended.lengths), *ended.outcome.items()):
            first.setdefault(key, torch.zeros(n, device=env.device))[ids] = value[keep].float()
        done[ids] = True
        if bool(done.all()):
            break
    task_id = first.pop(TASK_ID, None)  # a suite of tasks: its envs say which task each episode was
    for key in INSTRUCTED:  # training-time labels, not figures
        first.pop(key, None)
    out = {f"eval/{k}": v.mean().item() for k, v in first.items()}
    out["eval/return_std"] = first["return"].std(unbiased=False).item()
    names = getattr(env, "task_names", None)
    if task_id is not None and names and "success" in first:
        for k, name in enumerate(names):
            mine = (task_id == k) & done
            if bool(mine.any()):
                out[f"eval/success/{name}"] = first["success"][mine].mean().item()
    return out
