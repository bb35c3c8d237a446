"""An ensemble of independent learners (``ensemble=K``): K copies of the run's algorithm, each with its own seed,
networks, optimizer, replay and its own ``num_envs / K`` of the run's envs, trained side by side; the run's policy
is their action mean (``policies/ensemble.py``), which evaluation, the stop rule, checkpoints and export see.

Why: independent runs of one learner plateau at different blind spots. quadrotor-hover, 2000 fresh starts: each
of 20 runs flies 92-98% and the union 98.75%; the action mean of 5 runs flies 97.2-97.9%, of 9 runs 98.0%, while
snapshots of one run, or one actor over three twin critics, do not lift it (notes of stops 35-36). Members share
nothing: on a CPU learner each lives in a process of its own (``algos/remote.py``), so K members update on K cores
at once; otherwise (a CUDA learner, or ``ensemble_processes=false``) they update one after another in the run's
process.

``ensemble_replay=shared``: every member stores every env's transitions (one data stream, K learners on it), so each
has a plain run's data and updates, at K times the compute. Measured on quadrotor-hover with domain randomization
(4 members, seeds 0-9, closing note of stop 51): each run's members fly as their action mean does (their median
within 0.003 of it on 2000 randomized starts; mean 0.934, a single learner's level): on one replay they converge to
one policy, and the lift of independent runs comes from their own data, not their own initializations."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from embodied.algos.base import OFFLINE, Algorithm, BuildContext, Obs, Transition, split_act
from embodied.algos.remote import RemoteLearner, to_numpy
from embodied.core.errors import UserError
from embodied.policies.ensemble import EnsembleActor

SEED_STRIDE = 1_000_003  # member k's seed: the run's seed + k * SEED_STRIDE (member 0 is the plain run's learner)


def member_seed(seed: int, k: int) -> int:
    return seed + k * SEED_STRIDE


def _part(value: Any, k: int, size: int) -> Any:
    """Member ``k``'s rows of a batched value: tensors (first axis), dicts of them, a ``Transition`` field by field;
    None and strings (a transition's stream) as they are."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, torch.Tensor):
        return value[k * size:(k + 1) * size]
    if isinstance(value, Mapping):
        return {key: _part(v, k, size) for key, v in value.items()}
    if isinstance(value, Transition):
        return Transition(**{f: _part(getattr(value, f), k, size) for f in value.__dataclass_fields__})
    raise TypeError(f"cannot split a {type(value).__name__} over ensemble members")


class EnsembleAlgorithm(Algorithm):
    """``members`` built by the run's algorithm class; a batch of ``N`` envs is ``K`` consecutive slices of
    ``N / K``, slice ``k`` collected by and stored for member ``k``."""

    config_cls = None

    def __init__(self, members: list[Algorithm], shared: bool = False):
        self.members = members
        self.shared = shared  # every member observes every env's transitions
        self.paradigm = members[0].paradigm
        self.episodic = members[0].episodic
        self.remote = all(isinstance(m, RemoteLearner) for m in members)
        self._actor: EnsembleActor | None = None  # the last one handed out (a warm start loads into it)

    @classmethod
    def build_members(cls, algo_cls: type[Algorithm], cfg: Any, ctx: BuildContext, k: int,
                      processes: bool = True, shared: bool = False) -> EnsembleAlgorithm:
        """``processes``: each member in a spawned process (CPU learners only); else all in this one. ``shared``
        (``ensemble_replay=shared``): each member is built for all the run's envs and stores all their transitions,
        acting on its own slice; else member k is built for and stores its own ``num_envs / K`` envs."""
        offline = algo_cls.paradigm == OFFLINE  # members that never act in the envs (BC): nothing to split
        if k < 1 or (ctx.num_envs % k and not offline):
            raise UserError(f"ensemble={k} splits the run's envs evenly over its members: num_envs={ctx.num_envs} "
                            f"is not a multiple of {k}")
        if algo_cls.episodic:
            raise UserError("an ensemble of episodic-rollout learners (grpo) is not supported")
        # env steps split over the members; an offline learner's steps are its gradient steps, each member's all
        part = 1 if shared or offline else k
        subs = [dataclasses.replace(ctx, num_envs=ctx.num_envs // part, seed=member_seed(ctx.seed, i),
                                    total_steps=ctx.total_steps // part) for i in range(k)]
        if not processes or ctx.device.type != "cpu":
            return cls([algo_cls.build(cfg, sub) for sub in subs], shared)
        members = [RemoteLearner(algo_cls, cfg, sub, f"ensemble member {i}") for i, sub in enumerate(subs)]
        try:
            for m in members:
                m.wait_ready()
        except BaseException:
            for m in members:
                m.close()
            raise
        return cls(members, shared)

    @property
    def num_updates(self) -> int:  # the policy version: every member updates on the same calls
        return self.members[0].num_updates

    @property
    def rollout_length(self) -> int:
        return self.members[0].rollout_length

    @property
    def steps_per_update(self) -> int:  # every member updates on the same calls, each worth the same steps
        return self.members[0].steps_per_update

    def _size(self, batch: int) -> int:
        k = len(self.members)
        if batch % k:
            raise ValueError(f"a batch of {batch} envs does not split over {k} ensemble members")
        return batch // k

    def act(self, obs: Obs):
        n = self._size(next(iter(obs.values())).shape[0])
        if self.remote:  # every member acts (after its owed update) at once
            for k, m in enumerate(self.members):
                m.send("act", to_numpy(_part(obs, k, n)))
            outs = [m.finish_act(m.receive()) for m in self.members]
        else:
            outs = [split_act(m.act(_part(obs, k, n))) for k, m in enumerate(self.members)]
        action = torch.cat([a for a, _ in outs])
        if not outs[0][1]:
            return action
        return action, {key: torch.cat([e[key] for _, e in outs]) for key in outs[0][1]}

    def observe(self, tr: Transition) -> None:
        n = self._size(tr.reward.shape[0])
        for k, m in enumerate(self.members):
            m.observe(tr if self.shared else _part(tr, k, n))

    def update(self) -> dict[str, float]:
        """Every member's update (remote members: started, their previous metrics returned); metrics are the
        members' mean."""
        results = [m.update() for m in self.members]
        if not all(results):
            return {}
        keys = [key for key in results[0] if all(key in r for r in results)]
        return {key: sum(_scalar(r[key]) for r in results) / len(results) for key in keys}

    def actor(self) -> nn.Module:
        """In-process members' actors themselves; remote members' as copies (their weights now)."""
        self._actor = EnsembleActor([m.actor() for m in self.members])
        return self._actor

    def actor_loaded(self) -> None:
        for k, m in enumerate(self.members):
            if isinstance(m, RemoteLearner):  # the weights went into the copy ``actor()`` handed out
                m.load_actor(self._actor.members[k].state_dict())
            else:
                m.actor_loaded()

    def close(self) -> None:
        for m in self.members:
            m.close()

    def attach_model(self, model: Any) -> None:
        for m in self.members:
            m.attach_model(model)

    def state_dict(self) -> dict:
        return {"members": [m.state_dict() for m in self.members]}

    def load_state_dict(self, state: Mapping) -> None:
        members = state.get("members")
        if members is None or len(members) != len(self.members):
            have = "no ensemble" if members is None else f"an ensemble of {len(members)}"
            raise UserError(f"the checkpoint holds {have}; this run has ensemble={len(self.members)}")
        for m, s in zip(self.members, members):
            m.load_state_dict(s)


def _scalar(value: Any) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
