"""Run configuration: typed dataclasses, one per component, composed into ``RunConfig``.

Resolution order (later wins): dataclass defaults <- ``configs/<task>.yaml`` <- ``configs/<preset>.yaml``
<- command-line overrides (``key=value``, dotted for nested keys). OmegaConf structured configs
validate every key and value, so a typo is an error, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import embodied.tasks  # noqa: F401  (registers the tasks configs resolve against)
from embodied.core.errors import UserError
from embodied.core.registry import TASKS


@dataclass
class PolicyConfig:
    actor_hidden: list[int] = field(default_factory=lambda: [64, 64])
    critic_hidden: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"  # tanh | elu | relu
    obs_normalization: bool = True  # running mean/std inside the module (exported with it)
    symmetrize: bool = False  # TD3/SAC: actor exactly equivariant under the task's symmetry group (GroupMLP)


@dataclass
class PPOConfig:
    num_steps: int = 32  # rollout horizon per env per iteration
    num_epochs: int = 5
    num_minibatches: int = 4
    lr: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2  # surrogate ratio clip
    value_clip: float | None = None  # clip value updates to +-this (None: off)
    target_kl: float | None = 0.02  # stop the epoch loop when approx KL exceeds this (None: off)
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    max_grad_norm: float = 1.0
    init_log_std: float = -0.5
    normalize_advantages: bool = True


@dataclass
class OffPolicyConfig:
    """What SAC and TD3 share: twin critics with Polyak targets, replay, warm-up, update cadence."""

    lr_actor: float = 1e-3
    lr_critic: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005  # Polyak factor of the target networks
    batch_size: int = 256
    buffer_size: int = 1_000_000  # capped at total_steps
    warmup_steps: int = 5_000  # env steps of uniform random actions before learning
    updates_per_step: float = 0.2  # critic updates per env step (RLtools L2F: 1 per 5 steps)
    actor_every: int = 2  # actor (and targets, TD3) update on every n-th critic update
    max_grad_norm: float | None = 1.0
    weight_decay: float = 1e-4
    symmetry_augmentation: bool = False  # each replay row seen under a random element of the task's symmetry group


@dataclass
class SACConfig(OffPolicyConfig):
    lr_alpha: float = 1e-3
    init_alpha: float = 0.5
    target_entropy: float | None = None  # None: -act_dim


@dataclass
class TD3Config(OffPolicyConfig):
    exploration_noise: float = 0.1  # std of Gaussian noise on collected actions
    target_noise: float = 0.2  # target policy smoothing std
    target_noise_clip: float = 0.5


@dataclass
class LogConfig:
    run_root: str = "runs"
    eval_every: int = 20_000  # env steps between evaluations (0: only at the end)
    eval_episodes: int = 100
    checkpoint_every: int = 50_000  # env steps between checkpoints (0: only at the end)
    tensorboard: bool = True
    progress: bool = True  # live progress line on stderr
    log_every: int = 2_000  # env steps between metric lines


@dataclass
class RunConfig:
    task: str = ""
    algo: str = ""  # empty: the task's default algorithm
    seed: int = 0
    num_envs: int = 8
    total_steps: int = 200_000  # env steps summed over the batch
    sim_device: str = "cpu"
    learner_device: str = "cpu"
    torch_threads: int = 1  # intra-op threads; small networks run fastest (and steadiest) on one
    stop_success: float | None = None  # stop once periodic eval success >= this (None: never)
    env: Any = None  # the task's config dataclass
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    log: LogConfig = field(default_factory=LogConfig)


def config_dir() -> Path:
    return Path(str(resources.files("embodied.configs")))


def list_presets() -> list[str]:
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


def _merge(base, other, what: str):
    try:
        return OmegaConf.merge(base, other)
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        raise UserError(f"bad config in {what}: {msg}") from None


def load_config(task: str, preset: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Resolve a run config; every error a user can cause is a one-line ``UserError``."""
    spec = TASKS.get(task)
    cfg = OmegaConf.structured(RunConfig(task=task, algo=spec.default_algo, env=spec.config_cls()))
    task_yaml = config_dir() / f"{task}.yaml"
    if task_yaml.exists():
        cfg = _merge(cfg, OmegaConf.load(task_yaml), task_yaml.name)
    if preset:
        path = config_dir() / f"{preset}.yaml"
        if not path.exists():
            raise UserError(f"unknown preset {preset!r}; known: {', '.join(list_presets())}")
        cfg = _merge(cfg, OmegaConf.load(path), path.name)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"bad override {item!r}: expected key=value")
        cfg = _merge(cfg, OmegaConf.from_dotlist([item]), f"override {item!r}")
    run = OmegaConf.to_object(cfg)
    if run.task != task:
        raise UserError("the task is chosen with --task, not with an override")
    return run


def config_from_dict(data: dict) -> RunConfig:
    """Rebuild a saved (resolved) run config, validating it against the schema."""
    spec = TASKS.get(data["task"])
    cfg = OmegaConf.structured(RunConfig(task=spec.name, algo=spec.default_algo, env=spec.config_cls()))
    return OmegaConf.to_object(_merge(cfg, OmegaConf.create(data), "saved config"))


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: RunConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def make_task_config(task: str, **overrides) -> Any:
    """The task's config dataclass with keyword overrides (nested as dicts) validated."""
    spec = TASKS.get(task)
    cfg = _merge(OmegaConf.structured(spec.config_cls()), OmegaConf.create(overrides), f"overrides for {task}")
    return OmegaConf.to_object(cfg)
