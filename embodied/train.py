"""Build a run from a ``RunConfig`` (or resume one) and train it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import embodied.algos  # noqa: F401  (registers algorithms)
import embodied.tasks  # noqa: F401  (registers tasks)
from embodied.algos.base import OFF_POLICY, BuildContext
from embodied.algos.ensemble import EnsembleAlgorithm
from embodied.checkpoint import load_checkpoint
from embodied.config import RunConfig, config_from_dict, to_yaml
from embodied.core.base import resolve_device
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS, TASKS
from embodied.core.settings import LEARNER, RUN, check_settings, check_value
from embodied.evaluate import TaskEnvFactory, make_eval_env, make_train_env_factory, source_task
from embodied.provenance import code_commit, versions
from embodied.runners import RUNNERS
from embodied.runtime import make_collector


@dataclass(frozen=True)
class TaskModel:
    """``BuildContext.model``: ``model(num_envs, settings)`` is the task's differentiable model (``TaskSpec.model``)
    with the env settings the run is evaluated with (``eval``: the task's ``eval_config``) or trained with
    (``train``), on the learner device. A plain picklable value: ensemble members in processes receive it."""

    make: Callable
    settings: dict
    device: torch.device
    seed: int

    def __call__(self, num_envs: int, settings: str = "eval"):
        return self.make(self.settings[settings], num_envs, device=self.device, seed=self.seed)


def new_run_dir(cfg: RunConfig) -> Path:
    root = Path(cfg.log.run_root) / cfg.task.replace(":", "-")  # wm:pendulum -> runs/wm-pendulum (portable names)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / stamp
    i = 1
    while path.exists():  # two runs started in the same second
        path = root / f"{stamp}-{i}"
        i += 1
    path.mkdir(parents=True)
    return path


def build(cfg: RunConfig, run_dir: Path):
    """Collector, algorithm and runner of a run; names no algorithm, task or engine."""
    # the run's own counts and its stop rule's success rate (stop_passes, stop_success: null allowed)
    for name in ("torch_threads", "ensemble", "ensemble_replay", "num_envs", "total_steps", "stop_passes",
                 "stop_success", "stop_confirm"):
        check_value(name, getattr(cfg, name), RUN[name])
    check_settings("log", cfg.log, RUN)
    torch.set_num_threads(cfg.torch_threads)
    algo_cls = ALGOS.get(cfg.algo)
    check_settings(cfg.algo, cfg.algo_config, LEARNER)
    if algo_cls.paradigm not in RUNNERS:
        raise UserError(f"algorithm {cfg.algo!r} ({algo_cls.paradigm}) has no runner; "
                        f"runners: {', '.join(sorted(RUNNERS))}")
    sim_device, learner_device = resolve_device(cfg.sim_device), resolve_device(cfg.learner_device)
    spec = TASKS.get(cfg.task)  # an unknown task fails before any worker starts
    # a task that learns its simulator while training (wm:<task>) collects real experience on its source task
    imagination = spec.imagination(cfg, learner_device, run_dir) if spec.imagination is not None else None
    if imagination is not None and algo_cls.paradigm != OFF_POLICY:
        raise UserError(f"{cfg.task} learns its model while training, in the off-policy runner: use an off-policy "
                        f"algorithm (sac, td3), or give env.model=RUN_DIR to train {cfg.algo} in a fitted model")
    judge = None  # log.keep_best_by=model: how a policy is scored in the task's model
    if cfg.log.keep_best and cfg.log.keep_best_by == "model":
        judge = spec.judge(cfg, learner_device, imagination) if spec.judge is not None else None
        if judge is None:
            raise UserError(f"log.keep_best_by=model scores policies in a world model (a wm:<task> run); {cfg.task} "
                            "has none (log.keep_best_by=eval)")
    factory = TaskEnvFactory(*source_task(cfg), sim_device) if imagination is not None \
        else make_train_env_factory(cfg, sim_device)
    collector = make_collector(cfg.runtime.engine, factory, cfg.num_envs, cfg.seed, learner_device, cfg.runtime)
    # the learner observes imagined steps besides (or instead of) the real ones: its budget of observed steps
    observed = cfg.total_steps if imagination is None else \
        int(cfg.total_steps * imagination.observed_per_real_step(collector.num_envs))
    model = None  # the task's differentiable model
    if spec.model is not None:
        model = TaskModel(spec.model, {"eval": spec.eval_config(cfg.env) if spec.eval_config else cfg.env,
                                       "train": cfg.env}, learner_device, cfg.seed)
    ctx = BuildContext(collector.single_observation_space, collector.single_action_space, collector.num_envs,
                       learner_device, cfg.seed, observed, cfg.policy, collector.symmetry_group(),
                       collector.layout(), cfg.data, cfg.base, spec.success_metric,
                       learned_model=imagination is not None, num_tasks=collector.num_tasks(),
                       relabeller=collector.relabeller(), model=model)
    algo = None
    try:
        try:
            algo = algo_cls.build(cfg.algo_config, ctx) if cfg.ensemble == 1 else \
                EnsembleAlgorithm.build_members(algo_cls, cfg.algo_config, ctx, cfg.ensemble, cfg.ensemble_processes,
                                                cfg.ensemble_replay == "shared")
        except ValueError as e:  # torch's checks of the learner's settings (a negative lr...) are the user's input
            raise UserError(f"{cfg.algo}: {e}") from None
        if cfg.init:
            warm_start(algo.actor(), cfg.init)
            algo.actor_loaded()
    except BaseException:
        collector.close()
        if algo is not None:
            algo.close()
        raise
    return RUNNERS[algo_cls.paradigm](cfg, collector, algo, lambda: make_eval_env(cfg, cfg.log.eval_episodes),
                                      run_dir, imagination=imagination, judge=judge)


def warm_start(actor: torch.nn.Module, source: str) -> None:
    """Load every weight of ``actor`` (and its normalizer's statistics) from the policy of the run ``source``'s
    latest checkpoint (``init=RUN``): a fine-tuning run starts from a cloned policy. The two policies must be built
    alike (same spec name and sizes); a policy that samples is the policy it samples on either side. The policy's
    observation normalizer is frozen from there on."""
    from embodied.policies import policy_spec
    from embodied.policies.sampled import unwrapped, unwrapped_checkpoint

    ckpt = load_checkpoint(Path(source))
    # a policy that samples (filtered-bc.sampled_policy), on either side: the weights of the policy it samples
    spec, state = unwrapped_checkpoint(ckpt["policy"]["spec"], ckpt["policy"]["state"])
    actor = unwrapped(actor)
    mine = policy_spec(actor)
    if spec["name"] != mine["name"]:
        raise UserError(f"init={source}: its policy is a {spec['name']}, this run's a {mine['name']} (give the same "
                        "policy.arch and sizes)")
    try:
        actor.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise UserError(f"init={source}: its policy does not fit this run's ({first[-1].strip() if first else e})"
                        ) from None
    from embodied.policies.normalizer import EmpiricalNormalizer

    for module in actor.modules():  # the inputs stay scaled as the policy was trained with
        if isinstance(module, EmpiricalNormalizer):
            module.frozen = True
    if hasattr(actor, "init_kwargs"):  # kwargs that the weights carry (a VLA's action range) follow them
        for key in ("low", "high"):
            if key in spec["kwargs"] and key in actor.init_kwargs:
                actor.init_kwargs[key] = spec["kwargs"][key]
    differ = spec_differences(spec["kwargs"], mine["kwargs"])
    if differ:  # settings the weights fit either way (a pointer's hardness, a gain): the run's own apply, said once
        print(f"init={source}: the weights load, but its policy was built with {', '.join(differ)}; this run uses "
              "its own settings", file=sys.stderr)


def spec_differences(theirs: dict, mine: dict, where: str = "") -> list[str]:
    """``key=value`` (``theirs``'s) for every policy constructor setting that differs between two specs' kwargs,
    ensemble members' included (``members.0.key``); the action range (``low`` / ``high``) is the weights'."""
    out = []
    for key in sorted(set(theirs) & set(mine) - {"low", "high"}):
        a, b = theirs[key], mine[key]
        if key == "members" and isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                out += spec_differences(x.get("kwargs", {}), y.get("kwargs", {}), f"{where}members.{i}.")
        elif a != b:
            out.append(f"{where}{key}={a!r}")
    return out


def train(cfg: RunConfig, run_dir: Path | None = None) -> tuple[Path, dict]:
    """Start a new run; returns its directory and a summary."""
    torch.manual_seed(cfg.seed)
    # the folders this start creates, deepest first (the run directory, then the task's folder under the run root
    # and the root itself where they are new): a failed start removes them again, so it leaves nothing behind
    below = Path(run_dir) if run_dir else Path(cfg.log.run_root) / cfg.task.replace(":", "-") / "run"
    made = [p for p in (below, *below.parents) if not p.exists()][1:]
    created = run_dir is None or not Path(run_dir).exists()
    try:
        run_dir = Path(run_dir) if run_dir else new_run_dir(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the run directory: {e}") from None
    try:
        runner = build(cfg, run_dir)
    except BaseException:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
            for folder in made:  # empty folders above it that this start made
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    (run_dir / "provenance.json").write_text(json.dumps({"commit": code_commit(), **versions("torch")}, indent=1))
    return run_dir, runner.train()


def resume(run_dir: Path, total_steps: int | None = None) -> tuple[Path, dict]:
    """Continue a run exactly from its latest checkpoint (``total_steps`` may extend it)."""
    ckpt = load_checkpoint(run_dir)
    cfg = config_from_dict(ckpt["config"])
    if total_steps is not None:
        cfg.total_steps = total_steps
    if int(ckpt["step"]) >= cfg.total_steps:  # the loops would still run one more iteration past the budget
        raise UserError(f"the checkpoint of {run_dir} is at step {int(ckpt['step'])}, the budget total_steps="
                        f"{cfg.total_steps}: nothing to resume; give total_steps=N above {int(ckpt['step'])} to extend "
                        "the run")
    runner = build(cfg, Path(run_dir))
    runner.restore(ckpt)
    return Path(run_dir), runner.train()
