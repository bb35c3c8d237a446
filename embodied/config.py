"""Run configuration: typed dataclasses, one per component, composed into ``RunConfig``.

Resolution order (later wins): dataclass defaults <- ``configs/<task>.yaml`` <- ``configs/<preset>.yaml``
<- command-line overrides (``key=value``, dotted for nested keys). OmegaConf structured configs
validate every key and value, so a typo is an error, never silently ignored.

The learner's section is keyed by the algorithm's registered name (``ppo.lr=...``) and resolves into
``RunConfig.algo_config``, an instance of the algorithm's ``config_cls``. A YAML file may hold sections
for several algorithms (only the run's is read); a command-line key for an algorithm the run does not
use is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import embodied.tasks  # noqa: F401  (registers the tasks configs resolve against)
from embodied.core.errors import UserError
from embodied.core.registry import TASKS
from embodied.core.settings import TASK, check_settings


@dataclass
class VLAConfig:
    """The vision-language-action policy (``policy.arch=vla``; ``embodied/vla/model.py``)."""

    vision: str = "cnn"  # cnn (FiLM-conditioned) | vit: the image encoder where the task has an image term
    # mlp | tokens: the state terms also as tokens of a transformer with the instruction | pointers: attention heads
    # keyed by the instruction pick among the scene's like objects (terms of one kind), and the objects reach the
    # trunk only through them (state observations; with bc.ground the demonstrations say what to point at)
    state_encoder: str = "mlp"
    width: int = 256  # trunk width
    head: str = "tokens"  # tokens (256 bins per action dimension) | continuous (Gaussian chunk)
    bins: int = 256
    chunk: int = 1  # actions predicted per observation (beyond those executed: an auxiliary target)
    execute: int = 1  # of a chunk, the actions executed before the policy looks again (RL acts on the first)
    label_smoothing: float = 0.0  # behaviour cloning on tokens: mixed with a uniform over the bins
    label_sigma: float = 0.0  # [bins] behaviour cloning on tokens: targets spread as a Gaussian over nearby bins
    # behaviour cloning: Gaussian noise (std per entry) on the instruction embedding. 0.03 lifted held-out paraphrases
    # on point-reach-language (0.08 -> 0.39) but its norm (0.59) swamps what tells mini-libero's instructions apart
    # ("leftmost" / "rightmost": 0.15 apart): 10-demo BC there, term tokens, seeds 0-2: 9.7% without, 5.4% with it
    text_noise: float = 0.0
    # the entity pointers' query reads the instruction embedding times this gain: MiniLM's embeddings of "leftmost" and
    # "rightmost" phrasings are 0.99 alike, and at gain 1 the 10-demo clone's first choice between them is a coin flip
    query_gain: float = 1.0
    # with pointers: the trunk also reads where the second pointer's object stands from the first's (the goal from
    # the object to move, in units of 5 cm), the offset a placement must bring to zero, from the raw positions
    relation: bool = False
    # with pointers: each pointer hands the trunk exactly the one object it scores highest (a one-hot of the argmax,
    # trained straight-through: the softmax's gradient), in training and acting alike, instead of the softmax mixture
    hard_pointers: bool = False
    # the instruction embedding's features the trunk reads directly beside what the pointers hand it; 0: none (the
    # instruction acts only through the pointers' choice of objects: needs state_encoder=pointers). Mini-libero, one
    # demonstration a task, seed 0: BC 12.3% against 11.5%, filtered-bc's first evaluation 0.169 against 0.262
    # (stopped; issue 13, stop 76)
    text_features: int = 128


@dataclass
class PolicyConfig:
    arch: str = "mlp"  # mlp | vla (a language-conditioned task's vision-language-action policy)
    vla: VLAConfig = field(default_factory=VLAConfig)
    actor_hidden: list[int] = field(default_factory=lambda: [64, 64])
    critic_hidden: list[int] = field(default_factory=lambda: [64, 64])
    critic_layer_norm: bool = False  # SAC/TD3: LayerNorm on the Q networks' hidden layers (RLPD, FastTD3)
    activation: str = "tanh"  # tanh | elu | relu
    obs_normalization: bool = True  # running mean/std inside the module (exported with it)
    symmetrize: bool = False  # TD3/SAC: actor exactly equivariant under the task's symmetry group (GroupMLP)


@dataclass
class LogConfig:
    run_root: str = "runs"
    eval_every: int = 20_000  # env steps between evaluations (0: only at the end)
    eval_episodes: int = 100
    checkpoint_every: int = 50_000  # env steps between checkpoints (0: only at the end)
    keep_checkpoints: int = 3  # newest full checkpoints kept (replay included); older ones are removed
    # the policy a checkpoint holds for load_policy/eval/export is the best one of the periodic evaluations so far
    # (highest success, then return; SB3's best_model), not the latest; training resumes from the latest either way
    keep_best: bool = False
    # what "best" is: eval, the periodic evaluation's (success, return) on the real task; model (a run that learns a
    # model, wm:<task>): the imagined return under the newest model, the kept policy re-scored beside the new one at
    # each evaluation, so no real step chooses the policy (a policy trained only in the model stays that)
    keep_best_by: str = "eval"
    tensorboard: bool = True
    progress: bool = True  # live progress line on stderr
    log_every: int = 2_000  # env steps between metric lines


@dataclass
class RuntimeConfig:
    """Where simulation runs (embodied/runtime): the engine and its workers."""

    engine: str = "sync"  # sync (in-process) | async (worker processes, shared memory) | ray (Ray actors)
    num_workers: int = 2  # async/ray: worker processes, each stepping num_envs / num_workers envs
    ray_address: str | None = None  # ray: None starts a local instance; "auto" or host:port joins a cluster
    # native threads a batched backend (MuJoCo) steps its worlds with, per worker: sets the task's env.sim_threads;
    # None: the task's own setting
    sim_threads: int | None = None


@dataclass
class RunConfig:
    task: str = ""
    algo: str = ""  # empty: the task's default algorithm
    seed: int = 0
    num_envs: int = 8
    total_steps: int = 200_000  # env steps summed over the batch
    sim_device: str = "cpu"
    learner_device: str = "cpu"
    # torch's intra-op threads (and the TD3 kernel's, unless td3.kernel_threads says otherwise); small torch networks
    # run fastest (and steadiest) on one
    torch_threads: int = 1
    stop_success: float | None = None  # stop once periodic eval success >= this (None: never)
    # consecutive evaluations at or above stop_success that stop the run (None: 2 below 200 evaluation
    # starts, 1 from 200 on); each evaluation draws fresh starts
    stop_passes: int | None = None
    # when the stop rule needs more passes after a passing evaluation: next (at the following periodic evaluation, a
    # policy that trained eval_every steps more) or now (the same policy confirmed at once on 200 more fresh starts,
    # pooled). quadrotor-hover seeds 0-9: now stops at a median 60k env steps against 70k (process wall 15-16 s
    # against 18.8 s) but ships weaker policies: 0.963 against 0.971 mean success on 2000 strict starts, seed 2 at
    # 0.928 (closing note of stop 51)
    stop_confirm: str = "next"
    data: str = ""  # a recorded dataset (Minari) for offline algorithms (bc): data=PATH
    base: str = ""  # a frozen base policy for residual learners (residual-ppo/-sac): base=RUN_DIR or a bundle
    init: str = ""  # warm-start every weight of the policy from this run's latest checkpoint: init=RUN_DIR
    # K independent learners (own seeds, networks, replay, num_envs / K envs each), the run's policy their action
    # mean (embodied/algos/ensemble.py); 1: one learner
    ensemble: int = 1
    ensemble_processes: bool = True  # a CPU learner's members each in a process of their own (one per core)
    # own: member k stores and learns from only its own num_envs / K envs; shared: every member stores every env's
    # transitions (one data stream, K learners on it: each as much data as a plain run, K times its updates);
    # members still act on their own slices
    ensemble_replay: str = "own"
    env: Any = None  # the task's config dataclass
    algo_config: Any = None  # the algorithm's config dataclass (its section is named after the algorithm)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
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


def _algos():
    import embodied.algos  # noqa: F401  (registers the built-in algorithms)
    from embodied.core.registry import ALGOS

    return ALGOS


def _schema(task: str, algo: str):
    """The structured config a run of ``task`` with ``algo`` validates against."""
    spec, algo_cls = TASKS.get(task), _algos().get(algo)
    return OmegaConf.structured(RunConfig(task=spec.name, algo=algo, env=spec.config_cls(),
                                          algo_config=algo_cls.config_cls()))


def _route_algo_sections(layer: dict, algo: str, what: str, strict: bool) -> dict:
    """Move the run's algorithm section to ``algo_config``; drop other algorithms' sections (or, with
    ``strict``, refuse them: a command-line key for an algorithm the run does not train). The section of
    an algorithm whose config the run's extends (``ppo:`` for ``appo``) applies first."""
    algos = _algos()
    config_cls = algos.get(algo).config_cls
    parents = [n for n in algos.names() if n != algo and issubclass(config_cls, algos.get(n).config_cls)]
    out: dict = {}
    sections = [layer[n] for n in parents if n in layer] + ([layer[algo]] if algo in layer else [])
    if sections:
        out["algo_config"] = OmegaConf.to_container(OmegaConf.merge(*sections)) if len(sections) > 1 else sections[0]
    for key, value in layer.items():
        if key == "algo_config":
            raise UserError(f"bad config in {what}: set the learner's keys under its name ({algo}.KEY), "
                            "not algo_config")
        if key in algos and key != algo and key not in parents:
            if strict:
                raise UserError(f"{what} sets {key}.* but this run trains {algo}; set algo={key} to train "
                                f"{key}, or use {algo}.* keys")
        elif key not in algos:
            out[key] = value
    return out


def load_config(task: str, preset: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Resolve a run config; every error a user can cause is a one-line ``UserError``."""
    spec = TASKS.get(task)
    layers: list[tuple[dict, str, bool]] = []  # (values, where from, strict about other algorithms)
    task_yaml = config_dir() / f"{task.replace(':', '-')}.yaml"  # wm:pendulum -> wm-pendulum.yaml
    if task_yaml.exists():
        layers.append((OmegaConf.to_container(OmegaConf.load(task_yaml)), task_yaml.name, False))
    if preset:
        path = config_dir() / f"{preset}.yaml"
        if not path.exists():
            raise UserError(f"unknown preset {preset!r}; known: {', '.join(list_presets())}")
        layers.append((OmegaConf.to_container(OmegaConf.load(path)), path.name, False))
    for item in overrides:
        if "=" not in item:
            raise UserError(f"bad override {item!r}: expected key=value")
        try:
            values = OmegaConf.to_container(OmegaConf.from_dotlist([item]))
        except (OmegaConfBaseException, yaml.YAMLError) as e:  # the value is parsed as YAML
            raise UserError(f"bad override {item!r}: {str(e).splitlines()[0]}") from None
        layers.append((values, f"override {item!r}", True))
    algo = spec.default_algo
    for values, _, _ in layers:  # the learner is chosen first: it decides which section is read
        algo = values.get("algo", algo) or spec.default_algo
    if not isinstance(algo, str):
        raise UserError(f"bad algo {algo!r}; known: {', '.join(_algos().names())}")
    cfg = _schema(task, algo)
    for values, what, strict in layers:
        cfg = _merge(cfg, _route_algo_sections(values, algo, what, strict), what)
    run = OmegaConf.to_object(cfg)
    if run.task != task:
        raise UserError("the task is chosen with --task, not with an override")
    threads = run.runtime.sim_threads
    if threads is not None:  # the engine-level knob lands on the task's own
        if not hasattr(run.env, "sim_threads"):
            raise UserError(f"runtime.sim_threads: task {task!r} steps no native threads (its batch is tensors)")
        if threads < 1:
            raise UserError(f"runtime.sim_threads must be >= 1, got {threads}")
        run.env.sim_threads = threads
    check_settings("env", run.env, TASK)
    return run


def _saved_before(saved: dict, before: dict) -> dict:
    """``saved`` with the settings it lacks taken from ``before`` (nested sections filled key by key)."""
    out = dict(saved)
    for k, v in before.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _saved_before(out[k], v)
        elif k not in out:
            out[k] = v
    return out


def config_from_dict(data: dict) -> RunConfig:
    """Rebuild a saved (resolved) run config, validating it against the schema. A task setting the saved config
    lacks (added after it was written) takes the value the run had, which the task's config class declares in
    ``SAVED_BEFORE`` where it differs from the new default; otherwise the default."""
    spec = TASKS.get(data["task"])
    env, before = data.get("env"), getattr(spec.config_cls, "SAVED_BEFORE", {})
    if isinstance(env, dict):
        data = {**data, "env": _saved_before(env, before)}
    algo = data.get("algo") or spec.default_algo
    values = _route_algo_sections(data, algo, "saved config", strict=False)
    return OmegaConf.to_object(_merge(_schema(spec.name, algo), values, "saved config"))


def to_dict(cfg: RunConfig) -> dict:
    """The resolved config as plain data, the learner's section under the algorithm's name."""
    data = OmegaConf.to_container(OmegaConf.structured(cfg))
    return {(cfg.algo if k == "algo_config" else k): v for k, v in data.items()}


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


def make_task_config(task: str, **overrides) -> Any:
    """The task's config dataclass with keyword overrides (nested as dicts) validated."""
    spec = TASKS.get(task)
    cfg = _merge(OmegaConf.structured(spec.config_cls()), OmegaConf.create(overrides), f"overrides for {task}")
    cfg = OmegaConf.to_object(cfg)
    check_settings("env", cfg, TASK)
    return cfg
