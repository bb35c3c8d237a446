"""What off-policy actor-critics share (SAC, TD3): twin critics with Polyak targets, a replay
buffer on the learner device, uniform warm-up, an update-to-data credit, and one fused optimizer.
Subclasses supply the actor, its exploration, and the gradient step."""

from __future__ import annotations

import abc
import copy
from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from embodied.algos.base import (
    MAIN_STREAM,
    OFF_POLICY,
    Algorithm,
    BuildContext,
    Obs,
    Transition,
    critic_dim,
    critic_obs,
)
from embodied.algos.optim import FusedAdam, anneal_linear, check_lr_schedule, clip_grad_norm_
from embodied.algos.replay import NStepReturns, ReplayBuffer
from embodied.config import PolicyConfig
from embodied.core.errors import UserError
from embodied.core.symmetry import SymmetryGroup
from embodied.policies import TwinQCritic, update_normalizer


@dataclass
class OffPolicyConfig:
    """What SAC and TD3 share: twin critics with Polyak targets, replay, warm-up, update cadence."""

    lr_actor: float = 1e-3
    lr_critic: float = 1e-3
    # constant | linear: every group's learning rate falls linearly to 0 at total_steps (by the env steps stored)
    lr_schedule: str = "constant"
    gamma: float = 0.99
    tau: float = 0.005  # Polyak factor of the target networks
    batch_size: int = 256
    buffer_size: int = 1_000_000  # capped at total_steps
    warmup_steps: int = 5_000  # env steps of uniform random actions before learning
    updates_per_step: float = 0.2  # critic updates per env step (RLtools L2F: 1 per 5 steps)
    actor_every: int = 2  # actor (and targets, TD3) update on every n-th critic update
    critic_burn_in: int = 0  # env steps after warm-up during which only the critic learns (the actor stays as built)
    max_grad_norm: float | None = 1.0
    weight_decay: float = 1e-4
    symmetry_augmentation: bool = False  # each replay row seen under a random element of the task's symmetry group
    n_step: int = 1  # n-step returns in the critic target (FastTD3: 3); windows end at episode ends
    # RLPD (Ball et al. 2023): the fraction of each batch drawn from the demonstrations of ``data=PATH`` (one-step
    # rows, their recorded rewards), the rest from replay; 0.5 is RLPD's symmetric sampling; 0: no demonstrations
    demo_ratio: float = 0.0
    # the run's policy (evaluation, checkpoints, load_policy, export) is a Polyak average (``tau``, on actor steps)
    # of the actor's weights, not the actor itself (TD3: its target actor); exploration acts with the actor.
    # quadrotor-hover trained in its model (1M imagined steps): the final actor 0.59 / 0.65 real success, its
    # target 0.73 / 0.82 (100 starts each, two evaluation seeds)
    deploy_average: bool = False
    # the average's own rate (None: ``tau``, the critic targets' rate); TD3 then keeps a copy of its own beside the
    # target actor. An average spans about 1 / rate actor steps: at SAC's tau 0.005 ~200 (~800 env steps at 0.25
    # actor steps per env step), too short to smooth what the policy does between evaluations
    average_tau: float | None = None


class OffPolicyAlgorithm(Algorithm):
    paradigm = OFF_POLICY

    @classmethod
    def build(cls, cfg: OffPolicyConfig, ctx: BuildContext) -> OffPolicyAlgorithm:
        if ctx.image("policy") is not None:
            raise UserError(f"{cls.__name__.lower()} has no image encoder yet; camera observations train with "
                            "algo=ppo (or env.observation=state where the task has it)")
        algo = cls(cfg, ctx.policy, ctx.obs_space, ctx.action_space, ctx.num_envs, ctx.device, ctx.seed,
                   total_steps=ctx.total_steps, symmetry=ctx.symmetry)
        if cls.demos_at_build:
            algo.load_demos(ctx.data)
        return algo

    # a learner whose demonstration rows need more than its constructor made (a residual's base) loads them itself
    demos_at_build = True

    def __init__(self, cfg: OffPolicyConfig, policy: PolicyConfig, obs_space, action_space, num_envs: int,
                 device: torch.device, seed: int, total_steps: int | None = None,
                 symmetry: SymmetryGroup | None = None):
        self.cfg, self.device, self.num_envs = cfg, torch.device(device), num_envs
        self.policy_cfg = policy
        if not isinstance(action_space, gym.spaces.Box):
            raise UserError(f"{type(self).__name__.lower()} needs continuous (Box) actions, the task has "
                            f"{type(action_space).__name__}; use algo=ppo")
        if (cfg.symmetry_augmentation or policy.symmetrize) and symmetry is None:
            raise UserError("symmetry_augmentation / policy.symmetrize need a task that declares a symmetry group")
        check_lr_schedule("lr_schedule", cfg.lr_schedule)
        if cfg.average_tau is not None and not 0 < cfg.average_tau <= 1:
            raise UserError(f"average_tau is the averaged actor's rate: in (0, 1], got {cfg.average_tau}")
        self.symmetry = symmetry.to(self.device) if symmetry is not None else None
        self._critic_key = "critic" if "critic" in obs_space.spaces else "policy"
        self._row_group: tuple[torch.Tensor, torch.Tensor] | None = None  # built on first augmented batch
        obs_dim, cdim = obs_space["policy"].shape[0], critic_dim(obs_space)
        self.act_dim = act_dim = action_space.shape[0]
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        torch.manual_seed(seed)  # network initialization
        self.pi = self._make_actor(obs_dim, act_dim, policy).to(self.device)
        self.pi_average = self._make_average() if cfg.deploy_average else None  # what ``deploy_average`` ships
        critic = dict(hidden=policy.critic_hidden, activation=policy.activation, layer_norm=policy.critic_layer_norm)
        self.q = TwinQCritic(cdim, act_dim, **critic).to(self.device)
        self.q_target = TwinQCritic(cdim, act_dim, **critic).to(self.device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        # one fused Adam over the critic, actor (and subclass) groups, fed gradients from one
        # autograd.grad call per step (optim.py: torch.optim's per-step overhead dominated here)
        self.opt = FusedAdam(
            [{"params": self.q.parameters(), "lr": cfg.lr_critic, "weight_decay": cfg.weight_decay},
             {"params": self.pi.parameters(), "lr": cfg.lr_actor, "weight_decay": cfg.weight_decay},
             *self._extra_param_groups()])
        self.total_steps = total_steps
        self._base_lr = [g["lr"] for g in self.opt.groups]
        capacity = min(cfg.buffer_size, total_steps) if total_steps else cfg.buffer_size
        self.buffer = ReplayBuffer(capacity, obs_dim, cdim, act_dim, self.device)
        self._head_dims = (obs_dim, cdim, act_dim)
        self.nstep = NStepReturns(cfg.n_step, cfg.gamma, num_envs, sum(self._head_dims), self.device)
        self.streams: dict[str, NStepReturns] = {}  # the windows of other collectors' envs, by stream
        self.num_observed = 0  # env steps stored
        self.num_updates = 0  # critic gradient steps
        self._credit = 0.0  # fractional critic steps owed (updates_per_step * env steps)
        self._q_params, self._pi_params = self.opt.groups[0]["params"], self.opt.groups[1]["params"]
        self._qt_params = list(self.q_target.parameters())
        self.demos: ReplayBuffer | None = None  # RLPD's demonstration rows (``demo_ratio``), from ``load_demos``

    def load_demos(self, path: str) -> None:
        """With ``demo_ratio`` > 0: the dataset at ``path`` as replay rows of their own (``_demo_rows`` maps the
        task's rows to the learner's), one-step, ``discount = gamma (1 - terminated)``. Not checkpointed: a resumed
        run reads the dataset again."""
        from embodied.datasets import dataset_groups, read_transitions

        ratio = self.cfg.demo_ratio
        if ratio <= 0:
            return
        what = f"{type(self).__name__.lower()}.demo_ratio"
        if ratio >= 1:
            raise UserError(f"{what} is the fraction of each batch drawn from demonstrations: in (0, 1), got {ratio}")
        if not path:
            raise UserError(f"{what} > 0 learns from demonstrations too: give data=PATH")
        data = read_transitions(path, ["policy"])
        critic = read_transitions(path, ["critic"]) if "critic" in dataset_groups(path) else data
        rows = self._demo_rows(data["state"], critic["state"], data["action"].clamp(-1.0, 1.0),
                               data["next_state"], critic["next_state"])
        widths = {k: sl.stop - sl.start for k, sl in self.buffer.slices.items()}
        for key, value in zip(("obs", "cobs", "action"), rows[:3]):
            if value.shape[1] != widths[key]:
                raise UserError(f"the dataset {path} has {value.shape[1]} {key} entries per step; this run's "
                                f"learner reads {widths[key]}")
        n = data["reward"].shape[0]
        self.demos = ReplayBuffer(n, *(widths[k] for k in ("obs", "cobs", "action")), self.device)
        obs, cobs, action, next_obs, next_cobs = (r.to(self.device) for r in rows)
        discount = self.cfg.gamma * (1.0 - data["terminated"].float())
        self.demos.add(obs=obs, cobs=cobs, action=action, reward=data["reward"].to(self.device),
                       discount=discount.to(self.device), next_obs=next_obs, next_cobs=next_cobs)

    def _demo_rows(self, obs, cobs, action, next_obs, next_cobs) -> tuple[torch.Tensor, ...]:
        """A dataset's rows (the task's observation groups and actions) as this learner's replay columns."""
        return obs, cobs, action, next_obs, next_cobs

    # ---- subclass hooks ----------------------------------------------------------------------
    @abc.abstractmethod
    def _make_actor(self, obs_dim: int, act_dim: int, policy: PolicyConfig) -> nn.Module: ...

    @abc.abstractmethod
    def _explore(self, obs: torch.Tensor) -> torch.Tensor:
        """Exploration actions in [-1, 1] after warm-up."""

    @abc.abstractmethod
    def _gradient_step(self) -> dict[str, torch.Tensor]: ...

    def _extra_param_groups(self) -> list[dict]:
        return []

    def _make_average(self) -> nn.Module:
        """A copy of the actor that ``_average_step`` moves toward it (``deploy_average``)."""
        return copy.deepcopy(self.pi).requires_grad_(False)

    def _average_step(self) -> None:
        """After an actor step: the averaged actor moves by ``average_tau`` (or ``tau``) toward the actor."""
        if self.pi_average is not None:
            rate = self.cfg.tau if self.cfg.average_tau is None else self.cfg.average_tau
            self._polyak(list(self.pi_average.parameters()), self._pi_params, rate)

    def _sync_inputs(self, average: nn.Module) -> None:
        sync_inputs(average, self.pi)

    def _actor_step(self) -> bool:
        """Whether this critic step also updates the actor: every ``actor_every``-th one, after the burn-in."""
        burnt_in = self.num_observed >= self.cfg.warmup_steps + self.cfg.critic_burn_in
        return burnt_in and (self.num_updates + 1) % self.cfg.actor_every == 0

    def _sample(self) -> dict[str, torch.Tensor]:
        """A replay batch (with ``demo_ratio``, that fraction of it demonstration rows); with
        ``symmetry_augmentation`` each row under a random group element."""
        if self.demos is None:
            return self._sample_replay(self.cfg.batch_size)
        k = int(round(self.cfg.demo_ratio * self.cfg.batch_size))
        mine, demo = self._sample_replay(self.cfg.batch_size - k), self.demos.sample(k, self.generator)
        return {key: torch.cat([mine[key], demo[key]]) for key in mine}

    def _sample_replay(self, batch_size: int) -> dict[str, torch.Tensor]:
        if not self.cfg.symmetry_augmentation:
            return self.buffer.sample(batch_size, self.generator)
        if self._row_group is None:
            self._row_group = self._buffer_row_symmetry()
        index, sign = self._row_group

        def augment(rows: torch.Tensor) -> torch.Tensor:  # one gather for every field of the row
            g = torch.randint(index.shape[0], (rows.shape[0],), generator=self.generator, device=self.device)
            return rows.gather(1, index.index_select(0, g)) * sign.index_select(0, g)

        return self.buffer.sample(batch_size, self.generator, augment)

    def _buffer_row_symmetry(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The symmetry group acting on whole replay rows: ``[G, width]`` index and sign."""
        group, fields = self.symmetry, {"obs": "policy", "next_obs": "policy", "cobs": self._critic_key,
                                        "next_cobs": self._critic_key, "action": "action"}
        width = self.buffer.storage.shape[1]
        index = torch.arange(width, device=self.device).repeat(group.size, 1)
        sign = torch.ones(group.size, width, device=self.device)
        for name, sl in self.buffer.slices.items():
            if name in fields:
                index[:, sl] = group.index[fields[name]] + sl.start
                sign[:, sl] = group.sign[fields[name]]
        return index, sign

    # ---- verbs -------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        o = obs["policy"]
        if self.num_observed < self.cfg.warmup_steps:
            return self._warmup_action(o)
        return self._explore(o)

    def _actor_penalty(self, a_pi: torch.Tensor, q_pi: torch.Tensor) -> torch.Tensor | float:
        """A term added to the actor's loss (none here; a residual learner keeps its residual near zero)."""
        return 0.0

    def _warmup_action(self, obs: torch.Tensor) -> torch.Tensor:
        """Warm-up actions: uniform in [-1, 1]."""
        return torch.rand(obs.shape[0], self.act_dim, generator=self.generator, device=self.device) * 2 - 1

    def observe(self, tr: Transition) -> None:
        update_normalizer(self.pi, tr.obs["policy"])
        head, reward, discount, tail = self._nstep_for(tr.stream, tr.reward.shape[0]).push(
            torch.cat([tr.obs["policy"], critic_obs(tr.obs), tr.action], 1), tr.reward, tr.terminated,
            tr.truncated, torch.cat([tr.next_obs["policy"], critic_obs(tr.next_obs)], 1), tr.fresh)
        if reward.shape[0]:  # the buffer's columns: obs | cobs | action (the head) | reward | discount | the tail
            self.buffer.add_rows(torch.cat([head, reward[:, None], discount[:, None], tail], 1))
        n = tr.reward.shape[0]
        self.num_observed += n
        if self.num_observed >= self.cfg.warmup_steps and self.buffer.size >= self.cfg.batch_size:
            self._credit += n * self.cfg.updates_per_step

    def _nstep_for(self, stream: str, n: int) -> NStepReturns:
        """The n-step windows of a stream of ``n`` envs: the run's own collector's, or another collector's beside
        it (a learned model's rollouts), which never link to the real envs' steps."""
        if stream == MAIN_STREAM:
            return self.nstep
        if stream not in self.streams:
            self.streams[stream] = NStepReturns(self.cfg.n_step, self.cfg.gamma, n, sum(self._head_dims), self.device)
        return self.streams[stream]

    def update(self) -> dict[str, torch.Tensor]:
        metrics: dict[str, torch.Tensor] = {}
        if self.cfg.lr_schedule == "linear" and self.total_steps and self._credit >= 1.0:
            anneal_linear(self.opt.groups, self._base_lr, self.num_observed, self.total_steps)
        while self._credit >= 1.0:
            self._credit -= 1.0
            metrics = self._gradient_step()
        return metrics

    def actor(self) -> nn.Module:
        if self.pi_average is None:
            return self.pi
        self._sync_inputs(self.pi_average)
        return self.pi_average

    def actor_loaded(self) -> None:
        if self.pi_average is not None:  # a warm start went into the averaged copy: the actor starts from it too
            self.pi.load_state_dict(self.pi_average.state_dict())

    # ---- shared pieces of a gradient step ------------------------------------------------------
    def _apply(self, loss: torch.Tensor, actor_step: bool) -> None:
        """Gradients of the critic (and on actor steps, the actor's and any extra groups'), clipped
        per network, then one optimizer step."""
        groups = range(len(self.opt.groups)) if actor_step else range(1)
        params = [self.opt.groups[i]["params"] for i in groups]
        flat = torch.autograd.grad(loss, [p for ps in params for p in ps])
        grads, start = {}, 0
        for i, ps in zip(groups, params):
            grads[i] = flat[start:start + len(ps)]
            start += len(ps)
        if self.cfg.max_grad_norm is not None:
            for i in groups[:2]:
                clip_grad_norm_(grads[i], self.cfg.max_grad_norm)
        self.opt.step(grads)
        self.num_updates += 1

    @staticmethod
    @torch.no_grad()
    def _polyak(target: list[torch.Tensor], source: list[torch.Tensor], tau: float) -> None:
        torch._foreach_lerp_(target, source, tau)  # theta' <- theta' + tau (theta - theta')

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "pi": self.pi.state_dict(), "q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
            "opt": self.opt.state_dict(), "buffer": self.buffer.state_dict(),
            "generator": self.generator.get_state(), "num_observed": self.num_observed,
            "num_updates": self.num_updates, "credit": self._credit, "nstep": self.nstep.state_dict(),
            "streams": {n: w.state_dict() for n, w in self.streams.items()},
            **({"pi_average": self.pi_average.state_dict()} if self.pi_average is not None else {}),
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.opt.load_state_dict(state["opt"])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.set_state(state["generator"])
        self.num_observed = int(state["num_observed"])
        self.num_updates = int(state["num_updates"])
        self._credit = float(state["credit"])
        for stream, windows in state.get("streams", {}).items():
            self._nstep_for(stream, windows["head"].shape[1]).load_state_dict(windows)
        if self.pi_average is not None and "pi_average" in state:
            self.pi_average.load_state_dict(state["pi_average"])
        if "nstep" in state:
            self.nstep.load_state_dict(state["nstep"])
        else:  # a checkpoint from before n-step rows stored `done`; the column now holds gamma (1 - done)
            col = self.buffer.storage[: self.buffer.size, self.buffer.slices["discount"]]
            col.copy_(self.cfg.gamma * (1.0 - col))


@torch.no_grad()
def sync_inputs(average: nn.Module, source: nn.Module) -> None:
    """An averaged copy's weights trail ``source``'s; its input scaling (the normalizer's statistics, buffers that
    Polyak averaging does not touch) is ``source``'s own. Only the state's buffers: the non-persistent ones are built
    from the architecture (index tables) and are the same in both."""
    for t, src in zip(_state_buffers(average), _state_buffers(source), strict=True):
        t.copy_(src)


def _state_buffers(module: nn.Module) -> list[torch.Tensor]:
    """The buffers a module's ``state_dict`` holds (its persistent ones), in ``buffers()`` order."""
    return [b for m in module.modules() for name, b in m._buffers.items()
            if b is not None and name not in m._non_persistent_buffers_set]
