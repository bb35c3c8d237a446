"""Algorithm contract (DESIGN.md): a handful of verbs; algorithms never step environments."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import torch
from torch import nn

Obs = dict[str, torch.Tensor]

# paradigms: one runner each (embodied/runners); an algorithm names the one it runs under
ON_POLICY = "on_policy"
OFF_POLICY = "off_policy"
OFFLINE = "offline"
PARADIGMS = (ON_POLICY, OFF_POLICY, OFFLINE)
MAIN_STREAM = "main"  # Transition.stream of the run's own collector


@dataclass(frozen=True)
class BuildContext:
    """What an algorithm is built from, besides its own config: the env's spaces and the run's
    settings. ``symmetry`` is the task's group (``core/symmetry.py``) or None."""

    obs_space: gym.spaces.Dict  # per env
    action_space: gym.spaces.Box  # per env
    num_envs: int
    device: torch.device  # learner device
    seed: int
    total_steps: int
    policy: Any  # PolicyConfig
    symmetry: Any = None
    layout: Any = None  # the task's Layout (core/layout.py): image terms pick a CNN encoder
    data: str = ""  # the run's dataset (``data=PATH``): what an offline algorithm learns from
    base: str = ""  # the run's frozen base policy (``base=RUN_DIR`` or a bundle): what a residual learner corrects
    success_metric: str | None = None  # the task's ``final_info`` key saying an episode succeeded (TaskSpec)
    num_tasks: int = 0  # a suite's size (``VecEnv.num_tasks``): episodic rollouts can tell each env its task
    relabeller: Any = None  # the task's relabelling of recorded episodes (``core/relabel.py``) or None
    learned_model: bool = False  # the run learns a model of its task and hands it over (``Algorithm.attach_model``)
    # ``model(num_envs, settings="eval")``: the task's differentiable model (``TaskSpec.model``) with the env settings
    # the run is evaluated (``eval``) or trained (``train``) with, on the learner device; None where the task has none
    model: Any = None

    def image(self, group: str) -> list | None:
        """``[start, C, H, W]`` of the group's image term, or None; more than one image term is a UserError."""
        from embodied.core.errors import UserError

        images = self.layout.images(group) if self.layout is not None and group in self.layout.observation else []
        if len(images) > 1:
            raise UserError(f"observation group {group!r} has {len(images)} image terms; policies encode one "
                            "(stack cameras as channels of one term)")
        return [images[0][0].start, *images[0][1]] if images else None


def policy_group(policy: Any, symmetry: Any) -> list | None:
    """The group spec an actor is built equivariant under: the task's ``symmetry`` where ``policy.symmetrize``, else
    None; symmetrize on a task without a group is a UserError."""
    if not policy.symmetrize:
        return None
    if symmetry is None:
        from embodied.core.errors import UserError

        raise UserError("policy.symmetrize needs a task that declares a symmetry group")
    return symmetry.to_spec()


def deterministic_actor(policy: Any, obs_dim: int, act_dim: int, symmetry: Any = None) -> nn.Module:
    """The deterministic actor of the learners that share TD3's policy (td3, apg, distill): ``policy.actor_hidden``,
    its activation and observation normalization, equivariant under ``policy_group``. One construction, so a run of
    one initializes (``init=RUN``) and exports like a run of another."""
    from embodied.policies import DeterministicActor

    return DeterministicActor(obs_dim, act_dim, policy.actor_hidden, policy.activation, policy.obs_normalization,
                              group=policy_group(policy, symmetry))


class Starts(NamedTuple):
    """The starts of an episodic rollout: the envs reset from per-env seeds ``[N]`` (envs sharing a seed share their
    start exactly), in a suite each told its task ``tasks [N]`` where given (``VecEnv.reset_envs``); then envs
    ``restore = (env_ids, rows)`` put into recorded states (``VecEnv.restore_envs``) where given."""

    seeds: torch.Tensor
    restore: tuple[torch.Tensor, torch.Tensor] | None = None
    tasks: torch.Tensor | None = None


@dataclass
class Transition:
    """One batched env step, on the learner device. ``next_obs`` is the observation to bootstrap
    from: the final observation of an episode where it ended, the next one elsewhere."""

    obs: Obs
    action: torch.Tensor  # [N, act_dim]
    reward: torch.Tensor  # [N]
    terminated: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool
    next_obs: Obs
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # what ``act`` returned beside the action
    # [N] bool, or None: envs whose ``obs`` does not follow the previous transition's ``next_obs`` (an
    # engine dropped the step in between, e.g. the one in flight at a checkpoint); learners that link
    # consecutive transitions (n-step rows) must not link across it
    fresh: torch.Tensor | None = None
    # [N] bool, or None: rows whose ``next_obs`` is no observation of the step: a numerical fault (the env reset
    # it; ``ManagedVecEnv.step``'s ``info["faulted"]``) or a worker that died; a model fitted on transitions drops them
    faulted: torch.Tensor | None = None
    # which collector produced it: the run's own (MAIN_STREAM) or another beside it (a learned model's rollouts);
    # learners that link consecutive transitions keep one set of windows per stream
    stream: str = MAIN_STREAM
    # per-env outcome of the episodes that ended at this step (``info["final_info"]``: ``success``...), valid
    # where ``terminated | truncated``; None where the engine does not hand it on
    outcome: dict[str, torch.Tensor] | None = None


def split_act(out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``act`` returns an action, or ``(action, extras)`` where the algorithm needs values from acting
    time (PPO: the behaviour policy's log-probability and value) carried with the transition."""
    return out if isinstance(out, tuple) else (out, {})


class Algorithm(abc.ABC):
    """Registered in ``ALGOS`` under its name; declares its paradigm and config dataclass and builds
    itself, so the run builder, the runner table and ``RunConfig`` name no algorithm."""

    paradigm: ClassVar[str]  # one of PARADIGMS
    num_updates: int = 0  # learning updates so far: the policy version engines measure lag against
    # what one ``update`` counts toward the run's ``step`` in the offline runner: one gradient step (BC), or the steps
    # it simulated in a model (APG)
    steps_per_update: int = 1
    config_cls: ClassVar[type]  # its typed config, the ``<algo>.`` section of a run config

    @classmethod
    def build(cls, cfg: Any, ctx: BuildContext) -> Algorithm:
        """The algorithm for a run; raises ``UserError`` for a combination it does not support."""
        return cls(cfg, ctx.policy, ctx.obs_space, ctx.action_space, ctx.num_envs, ctx.device, ctx.seed,
                   total_steps=ctx.total_steps)

    @property
    def rollout_length(self) -> int:
        """Env steps per env collected between two ``update`` calls (on-policy: the rollout horizon)."""
        return 1

    # episodic rollouts (GRPO): the on-policy runner ends a rollout once every env has finished an episode, and
    # starts the next from ``rollout_starts()``
    episodic: ClassVar[bool] = False

    def rollout_starts(self) -> Starts | None:
        """Where the next rollout starts (``Starts``: per-env seeds, optionally each env's task and recorded states
        for some envs), or None to go on from where the envs are."""
        return None

    @abc.abstractmethod
    def act(self, obs: Obs) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Exploration actions ``[N, act_dim]`` for collection, optionally with ``extras`` that the
        collector hands back in the transition (engines may act on the next step before observing this one)."""

    @abc.abstractmethod
    def observe(self, transition: Transition) -> None:
        """Store what collection produced."""

    @abc.abstractmethod
    def update(self) -> dict[str, float]:
        """Learn from what was observed (may do nothing yet); returns scalar metrics."""

    @abc.abstractmethod
    def actor(self) -> nn.Module:
        """The actor whose ``act(obs)`` is the deterministic, exportable policy."""

    def actor_loaded(self) -> None:  # noqa: B027  (a hook: most learners keep no copy of the actor)
        """The actor's weights were replaced from outside (``init=RUN``): copies derived from it follow (a target
        actor). Nothing to do for a learner that keeps none."""

    def attach_model(self, model: Any) -> None:  # noqa: B027  (a hook: most learners only step envs)
        """A learned, differentiable model of the env this learner trains on (world-model runs; refitted in place
        as real data comes): ``model.imagine_step(obs, action, generator) -> (next_obs, reward, p_terminal)``.
        A learner that backpropagates through the dynamics keeps it; the others ignore it."""

    def close(self) -> None:  # noqa: B027  (a hook: most learners hold no process or file)
        """The run is over: release what the learner holds besides memory (an ensemble member's process)."""

    @abc.abstractmethod
    def state_dict(self) -> dict: ...

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping) -> None: ...


def critic_obs(obs: Obs) -> torch.Tensor:
    """Asymmetric actor-critic: the critic reads privileged state where the task has it."""
    return obs.get("critic", obs["policy"])


def critic_dim(space) -> int:
    return space["critic"].shape[0] if "critic" in space.spaces else space["policy"].shape[0]
