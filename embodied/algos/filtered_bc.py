"""Success-filtered behaviour cloning (self-imitation; rejection-sampling fine-tuning, as LLM and VLA RL call it): RL
with a binary success reward by supervised learning. Every rollout plays one episode per env from fresh starts,
sampling its actions at ``temperature``; the steps of the episodes that succeeded join a pool (beside the
demonstrations of ``data=PATH``, when given), and ``grad_steps`` gradient steps of the policy's own cloning loss
follow on minibatches drawn uniformly from the pool. This is the EM form of policy search with a 0/1 return
(reward-weighted regression with weights 0 and 1): each update fits the policy to the actions that led to success,
so the policy moves towards what worked, with the low variance of a supervised loss where GRPO's policy gradient
carries the score function's noise.

The pool keeps the newest ``capacity`` rollout steps (the demonstrations are always kept). Typical use, from a clone:
``embodied train algo=filtered-bc init=BC_RUN data=DEMOS``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from embodied.algos.base import BuildContext
from embodied.algos.bc import grounding_loss, relabel_copies
from embodied.algos.branch_starts import BranchStartsConfig
from embodied.algos.cotrain import DemoLoss, RowRing
from embodied.algos.demo_starts import DemoStartsConfig
from embodied.algos.grpo import SuccessRollouts, group_advantages
from embodied.algos.noise import ar1_step, check_correlation
from embodied.algos.off_policy import sync_inputs
from embodied.algos.task_sampling import TaskSamplingConfig
from embodied.core.base import INSTRUCTED, TASK_ID
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS
from embodied.policies import EnsembleActor
from embodied.policies.sampled import SampledActor, tempered


@dataclass
class FilteredBCConfig:
    group_size: int = 1  # envs per shared start (1: every env its own start)
    temperature: float = 1.0  # rollout sampling temperature on the policy's own noise
    # BC's rate: on mini-libero from the 10-demo clones, 300k steps, seeds 0-2 lifted 61.5 / 23.1 / 64.6% to 66.9 /
    # 56.9 / 71.5% (130 starts); 1e-4 barely moved seed 0's (520 starts: 62.3 -> 63.3%, 1e-3: 69.2%)
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 256
    grad_steps: int = 200  # gradient steps after every rollout
    capacity: int = 200_000  # rollout steps the pool keeps (newest first), beside the demonstrations
    max_grad_norm: float = 1.0
    # which successful episodes join the pool: won (every one) or mixed (only those of groups where another episode
    # from the same start failed: the starts the policy has not mastered; needs group_size >= 2)
    keep: str = "won"
    # the demonstrations' share of every minibatch once rollout steps joined the pool (RLPD's 0.5); None: uniform over
    # the pool, where the demonstrations' share falls as the pool grows (13k of 60k steps after 300k env steps)
    demo_ratio: float | None = None
    # how the rollout steps in a minibatch spread: pool (uniformly over the pool's steps, where the tasks a policy
    # already masters fill most of it) or task (every task of a suite an equal share of them: the task each episode
    # was, from the outcome's ``task_id``)
    balance: str = "pool"
    # BC's regularizers (bc.obs_noise, bc.ground), so that the clone is fine-tuned with the loss it was cloned with
    # (mini-libero's config sets both as its BC's): without the grounding loss the pointers learn from the actions alone
    obs_noise: float = 0.0
    ground: float = 0.0
    # the policy is the action mean of this many clones (start from an ``ensemble=K`` BC run: init=RUN): the rollouts
    # act with their mean (each member's Gaussian mean and scale averaged), and every member clones the shared pool,
    # each on its own minibatches with its own optimizer; 1: one policy
    members: int = 1
    # the pointers' grounding cross-entropy on every rollout step, of failed episodes too, with this weight; its labels
    # are the entities the task says each episode was instructed about (the outcome's INSTRUCTED: training-time labels
    # the policy never observes), where ``ground`` reads them off what successful episodes moved. From one
    # demonstration a task (mini-libero, seed 0) two thirds of the clone's failures point at the wrong cube. Measured
    # there at 300k steps, 260 starts: episodes whose pointer left the instructed cube 113 -> 1, success 37 -> 31 (no
    # lift: reaching and grasping fail instead); from the 10-demo ensemble 86.2 -> 80.0% (stop 68). 0: off
    ground_rollouts: float = 0.0
    ground_capacity: int = 100_000  # rollout steps the grounding ring keeps (newest first)
    # the run's policy (evaluation, checkpoints, load_policy, export) is a Polyak average of the trained weights, each
    # member's moved this fraction toward it after every gradient step (horizon ~1 / average_tau steps); the rollouts
    # act with the trained policy itself, so the training is the same with or without it. None: the trained policy.
    # mini-libero, 10-demo ensembles of seeds 0 / 1 (demonstrations of a scratch expert that lowers within 15 / 6 mm),
    # 0.001 (~5 rollouts' updates): 85.4 / 86.9% against the same runs' trained policies' 86.2 / 87.7% (130 starts),
    # in-run evaluations smoother but lagging early (stop 69)
    average_tau: float | None = None
    # the run's policy (evaluation, checkpoints, load_policy, export) samples its actions as the rollouts do, at
    # ``temperature`` (the members' mean of means and of scales), instead of taking their mean: the pool clones
    # sampled actions, so the sampling policy is the one whose success the updates raise. Needs a Gaussian policy.
    # mini-libero (its config sets it), five-clone ensembles of seeds 0-4, 300k steps, the same runs on 130 starts:
    # mean 85.5 -> 88.0%, the lowest seed 79.2 -> 90.8%, the highest 90.0 -> 83.1% (stop 70)
    sampled_policy: bool = False
    # the pool's actions are fitted with the likelihood of the policy sampled at ``temperature`` (the one the rollouts
    # draw them from and, with sampled_policy, the run ships): its std settles at their spread / temperature. Off, the
    # plain likelihood fits the std to the spread of actions drawn at std x temperature, which shrinks the std by the
    # temperature with every generation of the pool (mini-libero, the 1-demo clones of seed 1 at 0.5: log std -2.4 /
    # -2.4 / -1.9 -> -3.2 / -3.1 / -2.9 on the moves and -2.5 -> -4.6 on two turns in 300k steps), and with it the
    # rollouts' exploration. Needs a Gaussian cloning loss (the VLA's continuous head). Measured there from the same
    # clone (seed 1, mirror 0.25, 130 starts): in-run 0.377 0.423 0.400 at 58k / 106k / 154k against 0.462 0.515 0.546
    # off, rollout success 0.27-0.44 against 0.36-0.52 (stopped at 182k). My reading (not measured): the
    # demonstrations, fitted at the temperature too, pull the std toward twice the clone's (the loss's optimum), and
    # the shrinking std is the sharper policy; off
    fit_temperature: bool = False
    demo_starts: DemoStartsConfig = field(default_factory=DemoStartsConfig)  # groups from demonstration states
    branch_starts: BranchStartsConfig = field(default_factory=BranchStartsConfig)  # groups from its own states
    # a suite's rollout tasks drawn by their failure rates (by=failures), so the tasks it fails get more rollouts:
    # mini-libero from the 10-demo ensembles of seeds 0-4, sampled policy, 88.0 -> 88.5% on the figure's 130 starts and
    # 87.6 -> 88.1% on 390 others, within the runs' noise; off (issue 13, stop 71)
    task_sampling: TaskSamplingConfig = field(default_factory=TaskSamplingConfig)
    # relabelled copies of every demonstration and of every successful rollout episode join the pool beside it (the
    # task's relabelling, ``core/relabel.py``: on mini-libero a success on one cube is one on the others; the pool's
    # ``filtered-bc/rollout_steps`` count the copies); 0: none
    relabel: int = 0
    # a successful episode's steps are drawn from the pool in proportion to discount ** T, T its length in steps (the
    # discounted return of the 0/1 success reward: reward-weighted regression's weights, as in AWR with a sparse
    # reward), so the quicker successes, the ones without hesitations and second tries, weigh more than the slow ones
    # among the policy's own (T counts from the episode's start in its rollout: with demo_starts or branch_starts,
    # from the restored state, so those weigh by what was left); the demonstrations keep their uniform share. None:
    # every success alike (the 0/1 return).
    # mini-libero, 1 demo a task, 0.97 (a 40-step success 3.4x a 80-step one), from the clones of seeds 1 / 4, 160k
    # steps, the kept policy on the figure's 130 starts: 42.3 / 45.4% against 50.0 / 40.8% without (in-run 0.415 0.492
    # 0.469 against 0.462 0.515 0.546 on seed 1); off (issue 13, stop 78)
    discount: float | None = None
    # the rollouts' exploration noise in time: each env's standard normal noise follows an AR(1) process through the
    # rollout, noise_t = rho * noise_{t-1} + sqrt(1 - rho^2) * fresh_t (rho this; still standard normal at every step,
    # so each action's spread is the policy's at ``temperature``), so that the noise adds up to coherent departures
    # from the mean path (an arm reaching a few cm elsewhere) that white noise averages away: a departure over k steps
    # spreads ~sqrt((1 + rho) / (1 - rho)) times as far (3x at 0.8; OU noise in DDPG, pink noise). Only exploration:
    # the pool clones the actions taken, and the shipped policy (sampled_policy) samples white noise. 0: white.
    # mini-libero, 1 demo a task, 0.8, the 1-demo figure's pipeline (five-clone ensembles, mirror, keep_best, 160k
    # steps), seeds 0-4, 130 starts: 53.1 / 58.5 / 47.7 / 53.1 / 55.4% against white noise's 46.9 / 50.0 / 43.8 / 48.5
    # / 40.8% (stop 77), +35.5 points over the clones on the mean against +28.0 (seed 1 over 6 x 130 starts: 53.6
    # against 50.8%, the never-won starts 33 against 34: the gain is on starts already won at times; issue 13, stop
    # 78). From 10 demos a task it costs (seed 0's mirror clone, 77.7%, 160k steps: 88.5% with 0.8, 96.9% white; stop
    # 79): off
    noise_correlation: float = 0.0


class FilteredBC(SuccessRollouts):
    name = "filtered-bc"
    config_cls = FilteredBCConfig

    @classmethod
    def build(cls, cfg: FilteredBCConfig, ctx: BuildContext) -> FilteredBC:
        cls.check("filtered-bc", ctx, cfg, min_group=1)
        if cfg.batch_size < 1 or cfg.grad_steps < 0 or cfg.capacity < 1 or not cfg.lr > 0:
            raise UserError("filtered-bc: batch_size >= 1, grad_steps >= 0, capacity >= 1 and lr > 0")
        if cfg.members < 1:
            raise UserError(f"filtered-bc.members is the number of clones acting as one: >= 1, got {cfg.members}")
        if cfg.members > 1 and ctx.policy.arch == "vla" and ctx.policy.vla.head != "continuous":
            raise UserError("filtered-bc.members > 1 averages the members' Gaussian actions: give the policy a "
                            "continuous head (policy.vla.head=continuous)")
        if cfg.keep not in ("won", "mixed") or (cfg.keep == "mixed" and cfg.group_size < 2):
            raise UserError(f"filtered-bc.keep is won or mixed (mixed needs group_size >= 2); got {cfg.keep!r} with "
                            f"group_size {cfg.group_size}")
        if cfg.balance not in ("pool", "task"):
            raise UserError(f"filtered-bc.balance is pool or task, got {cfg.balance!r}")
        if cfg.ground_rollouts < 0 or cfg.ground_capacity < 1:
            raise UserError("filtered-bc: ground_rollouts >= 0 and ground_capacity >= 1")
        if cfg.discount is not None and not 0 < cfg.discount <= 1:
            raise UserError(f"filtered-bc.discount weighs a success of T steps by discount ** T: in (0, 1] (or null: "
                            f"none), got {cfg.discount}")
        check_correlation("filtered-bc.noise_correlation", cfg.noise_correlation)
        if cfg.average_tau is not None and not 0 < cfg.average_tau <= 1:
            raise UserError(f"filtered-bc.average_tau is a rate in (0, 1] (or null: none), got {cfg.average_tau}")
        # the options that draw a Gaussian policy's noise (a token head samples bins)
        noisy = [k for k, on in (("sampled_policy", cfg.sampled_policy),
                                 ("noise_correlation", cfg.noise_correlation > 0)) if on]
        if noisy and ctx.policy.arch == "vla" and ctx.policy.vla.head != "continuous":
            raise UserError(f"filtered-bc.{noisy[0]} draws a Gaussian policy's noise: give the VLA a continuous head "
                            "(policy.vla.head=continuous)")
        if cfg.fit_temperature and not (ctx.policy.arch == "vla" and ctx.policy.vla.head == "continuous"):
            raise UserError("filtered-bc.fit_temperature fits the std of a Gaussian cloning loss: give the VLA a "
                            "continuous head (policy.arch=vla policy.vla.head=continuous)")
        return cls(cfg, ctx)

    def __init__(self, cfg: FilteredBCConfig, ctx: BuildContext):
        super().__init__(cfg, ctx)
        obs_dim = ctx.obs_space["policy"].shape[0]
        # member 0 is the rollouts' ``pi``; the others are built alike (their weights come from init=)
        self.members = [self.pi, *(self.build_policy(ctx).to(self.device) for _ in range(cfg.members - 1))]
        self.ensemble = EnsembleActor(self.members) if cfg.members > 1 else None
        self.opts = [torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay) for m in self.members]
        # average_tau: each member's averaged copy, and the policy the run ships (their ensemble, or the one copy)
        self.averages = [copy.deepcopy(m).requires_grad_(False) for m in self.members] \
            if cfg.average_tau is not None else []
        self.average = (EnsembleActor(self.averages) if cfg.members > 1 else self.averages[0]) if self.averages \
            else None
        # the run's policy: the averages, or the members' ensemble, or the one policy; sampled_policy: sampled
        self.shipped = self.average if self.average is not None else self.ensemble if self.ensemble is not None \
            else self.pi
        if cfg.sampled_policy:
            self.shipped = SampledActor(self.shipped, cfg.temperature, seed=ctx.seed)
        recipe = {"obs_noise": cfg.obs_noise, "ground": cfg.ground, "balance": cfg.balance == "task",
                  "relabeller": ctx.relabeller,
                  "relabel": relabel_copies("filtered-bc.relabel", cfg.relabel, ctx), "generator": self.generator,
                  "weighted": cfg.discount is not None}
        self.pool = DemoLoss(ctx.data, self.pi, obs_dim, self.device, cfg.batch_size, "filtered-bc", ctx.layout,
                             capacity=cfg.capacity, demo_ratio=cfg.demo_ratio, **recipe) if ctx.data else \
            DemoLoss.empty(self.pi, obs_dim, self.device, cfg.batch_size, ctx.layout, capacity=cfg.capacity, **recipe)
        self.loss_args = {"std_temperature": cfg.temperature} if cfg.fit_temperature else {}
        self.num_updates = 0
        self.told = None
        if cfg.ground_rollouts > 0:
            if getattr(self.pi, "pointers", None) is None:
                raise UserError("filtered-bc.ground_rollouts trains a pointer policy's grounding: give the VLA entity "
                                "pointers (policy.vla.state_encoder=pointers)")
            self.told = InstructedSteps(self.pool.packer, cfg.ground_capacity)

    def _new_rollout(self) -> None:
        super()._new_rollout()
        self.noise: torch.Tensor | None = None  # the rollout's correlated noise [N, act_dim], drawn at its first step

    @torch.no_grad()
    def act(self, obs):
        """The tempered policy's action; with ``noise_correlation``, its noise the AR(1) process through the rollout."""
        rho = self.cfg.noise_correlation
        if rho == 0:
            return super().act(obs)
        dist = self.dist(obs["policy"])
        fresh = torch.randn(dist.mean.shape, generator=self.generator, device=dist.mean.device)
        self.noise = ar1_step(self.noise, fresh, rho)
        action = dist.mean + dist.stddev * self.noise
        return action, {"log_prob": dist.log_prob(action)}

    def close_rollout(self) -> dict[str, float]:
        """The successful episodes' steps (each episode contiguous) into the pool."""
        cols, valid = self.take_steps()
        won = self.ended & (self.success > 0.5)
        if self.told is not None:
            self._keep_instructed(cols, valid)
        if self.cfg.keep == "mixed":
            won &= group_advantages(self.success, self.cfg.group_size)[1]
        mask = (valid & won[None]).T  # [N, T]: env-major, so each episode's steps stay together
        if bool(mask.any()):
            rows = {k: v.transpose(0, 1)[mask] for k, v in cols.items() if k not in ("action", "log_prob")}
            episode = torch.arange(self.num_envs, device=self.device)[:, None].expand_as(mask)[mask]
            group = None
            if self.pool.balance:
                if bool((self.task_of[won] < 0).any()):
                    raise UserError("filtered-bc.balance=task needs a suite whose episodes report their task "
                                    f"(the outcome's {TASK_ID!r}); this task reports none: use balance=pool")
                group = self.task_of[:, None].expand_as(mask)[mask]
            weight = None
            if self.cfg.discount is not None:  # discount ** T, T each episode's length (its steps in this rollout)
                weight = (self.cfg.discount ** valid.sum(0).double())[:, None].expand_as(mask)[mask]
            self.pool.extend(rows, cols["action"].transpose(0, 1)[mask], episode, group, weight)
        return {**self.rollout_log(valid), "filtered-bc/won_episodes": float(won.sum()),
                "filtered-bc/pool_steps": float(self.pool.size), "filtered-bc/rollout_steps": float(self.pool.added)}

    def _keep_instructed(self, cols: dict[str, torch.Tensor], valid: torch.Tensor) -> None:
        """Every finished first episode's steps into the grounding ring, each labelled with its episode's
        instructed entities."""
        if bool((self.ended & (self.instructed_of[:, 0] < 0)).any()):
            raise UserError("filtered-bc.ground_rollouts needs a task whose episodes report the entities their "
                            f"instruction names (the outcome's {INSTRUCTED[0]!r}); this task reports none")
        mask = (valid & self.ended[None]).T  # [N, T], env-major
        if bool(mask.any()):
            rows = {k: v.transpose(0, 1)[mask] for k, v in cols.items() if k not in ("action", "log_prob")}
            self.told.extend(rows, self.instructed_of[:, None].expand(-1, mask.shape[1], -1)[mask])

    def _loss(self, member: nn.Module) -> torch.Tensor:
        """One gradient step's loss: the pool's cloning loss, plus the grounding loss on instructed rollout steps."""
        loss = self.pool(member, self.generator, **self.loss_args)
        if self.told is not None and self.told.filled:
            obs, labels = self.told.sample(self.cfg.batch_size, self.generator)
            loss = loss + self.cfg.ground_rollouts * grounding_loss(member, obs, labels)[0]
        return loss

    def update(self) -> dict[str, float]:
        log = self.close_rollout()
        if self.pool.size == 0 or self.cfg.grad_steps == 0:
            return log
        total = 0.0
        for i, (member, opt) in enumerate(zip(self.members, self.opts)):
            for _ in range(self.cfg.grad_steps):
                loss = self._loss(member)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(member.parameters(), self.cfg.max_grad_norm)
                opt.step()
                if self.averages:
                    follow(self.averages[i], member, self.cfg.average_tau)
                total += float(loss.detach())
        self.num_updates += 1
        log["filtered-bc/loss"] = total / (self.cfg.grad_steps * len(self.members))
        # a Gaussian policy's state-independent log std (the members' mean): cloning the pool moves it
        stds = [m.log_std.detach().mean() for m in self.members
                if isinstance(getattr(m, "log_std", None), torch.Tensor)]
        if stds:
            log["filtered-bc/log_std"] = float(torch.stack(stds).mean())
        return log

    def dist(self, obs: torch.Tensor):
        """One policy's tempered distribution; the members' as one Gaussian: the mean of their means (the action
        the ensemble's ``act`` takes) and of their scales."""
        return tempered(self.pi if self.ensemble is None else self.ensemble, obs, self.cfg.temperature)

    def actor(self) -> nn.Module:
        if self.average is not None:
            for average, member in zip(self.averages, self.members):  # the inputs scaled as the trained policy's
                sync_inputs(average, member)
        return self.shipped

    def actor_loaded(self) -> None:
        for average, member in zip(self.averages, self.members):  # init= went into the averages: train from them
            member.load_state_dict(average.state_dict())

    def state_dict(self) -> dict:
        members = {"members": [m.state_dict() for m in self.members[1:]]} if self.ensemble is not None else {}
        told = {"told": self.told.state_dict()} if self.told is not None else {}
        averages = {"averages": [a.state_dict() for a in self.averages]} if self.averages else {}
        return {**self.rollout_state(), **members, **told, **averages, "opts": [o.state_dict() for o in self.opts],
                "pool": self.pool.state_dict(), "num_updates": self.num_updates}

    def load_state_dict(self, state: Mapping) -> None:
        self.load_rollout_state(state)
        for m, s in zip(self.members[1:], state.get("members", [])):
            m.load_state_dict(s)
        for o, s in zip(self.opts, state["opts"] if "opts" in state else [state["opt"]]):  # "opt": one policy's
            o.load_state_dict(s)
        self.pool.load_state_dict(state["pool"])
        if self.told is not None and "told" in state:
            self.told.load_state_dict(state["told"])
        for a, s in zip(self.averages, state.get("averages", [])):
            a.load_state_dict(s)
        self.num_updates = int(state["num_updates"])


@torch.no_grad()
def follow(average: nn.Module, source: nn.Module, rate: float) -> None:
    """Polyak step: every parameter of ``average`` moves ``rate`` of the way to ``source``'s."""
    torch._foreach_lerp_(list(average.parameters()), list(source.parameters()), rate)


class InstructedSteps(RowRing):
    """A ring of the newest ``capacity`` rollout steps (packed observations) with their episodes' instructed entities
    ``[2]`` (``INSTRUCTED``), for the pointers' grounding loss; minibatches drawn uniformly."""

    def __init__(self, packer, capacity: int):
        self.packer, self.capacity = packer, capacity
        self.ring: dict[str, torch.Tensor] = {}
        self.filled = self.added = 0

    @torch.no_grad()
    def extend(self, obs: dict[str, torch.Tensor], labels: torch.Tensor) -> None:
        self._write({**obs, "labels": labels.long()})

    def sample(self, k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` rows: observations ``[k, obs_dim]`` and labels ``[k, 2]``."""
        j = torch.randint(self.filled, (k,), generator=generator, device=generator.device)
        rows = {key: v[j] for key, v in self.ring.items()}
        labels = rows.pop("labels")
        return self.packer.unpack_rows(rows, slice(None)), labels


ALGOS.register("filtered-bc", FilteredBC)
