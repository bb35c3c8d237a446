"""GRPO with a binary success reward, as SimpleVLA-RL fine-tunes VLAs (``subsystems.md`` 4.1): no critic, no KL.

Every rollout starts the envs in groups of ``group_size`` that share one initial state exactly (per-env seeds,
``VecEnv.reset_envs``) and plays one episode per env (the on-policy runner's episodic mode); actions are sampled
at ``temperature``. An episode's reward is the task's success (``TaskSpec.success_metric``), and its advantage,
shared by every action token of the episode, is ``(R_i - mean_G R) / (std_G R + eps)`` over its group.

Dynamic sampling: groups whose episodes all succeeded or all failed carry no signal (zero advantage) and are
dropped; the kept groups pile up over rollouts until ``batch_groups`` are there (or ``max_fill_rollouts``
rollouts went by), then one update runs on them. The loss is the clipped surrogate with clip-higher, averaged
over every action token (each action dimension of each step is one token):

    L = -(1 / #tokens) sum_tokens min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)

With ``bc_coef`` > 0 and ``data=PATH`` the cloning loss on the demonstrations is added (co-training, RLinf-Co)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import gymnasium as gym
import torch
from torch import nn

from embodied.algos.base import ON_POLICY, Algorithm, BuildContext, Obs, Starts, Transition
from embodied.algos.branch_starts import BranchStarts, BranchStartsConfig
from embodied.algos.cotrain import CotrainConfig, cotraining
from embodied.algos.demo_starts import DemoStarts, DemoStartsConfig
from embodied.algos.task_sampling import TaskSampler, TaskSamplingConfig
from embodied.core.base import INSTRUCTED, TASK_ID
from embodied.core.errors import UserError
from embodied.core.pixels import PixelPacker
from embodied.core.registry import ALGOS
from embodied.policies import GaussianActor
from embodied.policies.actor_critic import sample_action
from embodied.policies.sampled import tempered

EPS = 1e-6


@dataclass
class GRPOConfig(CotrainConfig):
    group_size: int = 8  # rollouts per initial state
    batch_groups: int = 0  # mixed-outcome groups an update waits for; 0: as many as one rollout holds
    max_fill_rollouts: int = 4  # rollouts dynamic sampling may wait over before it updates on what it has
    lr: float = 3e-4  # SimpleVLA-RL's 5e-6 is for a 7B model; this is for networks of a few M parameters
    clip_low: float = 0.2
    clip_high: float = 0.28  # clip-higher (DAPO): more room to raise unlikely good tokens
    temperature: float = 1.6  # rollout sampling temperature (the ratio uses the same tempered policy)
    num_epochs: int = 4  # passes over an update's batch
    minibatch_tokens: int = 4096  # action tokens per gradient step
    max_grad_norm: float = 1.0
    demo_starts: DemoStartsConfig = field(default_factory=DemoStartsConfig)  # groups from demonstration states
    branch_starts: BranchStartsConfig = field(default_factory=BranchStartsConfig)  # groups from its own states
    task_sampling: TaskSamplingConfig = field(default_factory=TaskSamplingConfig)  # a suite's tasks by failures


def group_advantages(success: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per episode ``[N]`` (groups of ``group_size`` consecutive envs): the group-normalized advantage
    ``(R - mean) / (std + 1e-6)`` (std unbiased, as torch's and veRL's) and whether its group is kept by dynamic
    sampling (``0 < successes < group_size``)."""
    r = success.float().view(-1, group_size)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + EPS)
    wins = r.sum(1)
    keep = (wins > 0) & (wins < group_size)
    return adv.reshape(-1), keep.repeat_interleave(group_size)


def clipped_objective(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor,
                      clip_low: float, clip_high: float) -> torch.Tensor:
    """The per-token surrogate ``min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)`` (to be maximized)."""
    ratio = torch.exp(log_prob - old_log_prob)
    return torch.minimum(ratio * advantage, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantage)


class SuccessRollouts(Algorithm):
    """Episodic rollouts scored by success, the collecting half of the learners that learn from whole episodes' binary
    outcome (GRPO, filtered BC): every rollout starts the envs in groups of ``cfg.group_size`` that share one initial
    state exactly (per-env seeds), plays one episode per env at ``cfg.temperature`` and records each step (camera
    entries packed as uint8), whether it belongs to its env's first episode, and each episode's success."""

    paradigm = ON_POLICY
    episodic = True

    def __init__(self, cfg, ctx: BuildContext):
        self.cfg, self.device = cfg, torch.device(ctx.device)
        self.num_envs, self.success_key = ctx.num_envs, ctx.success_metric
        obs_dim = ctx.obs_space["policy"].shape[0]
        torch.manual_seed(ctx.seed)
        self.pi = self.build_policy(ctx).to(self.device)
        # rollouts keep camera entries as uint8 (a 2-camera 64x64 step: 24.6 KB, not 98 KB), the rest as floats
        self.packer = PixelPacker.of(ctx.layout, "policy", obs_dim)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(ctx.seed)
        self.seed_generator = torch.Generator().manual_seed(ctx.seed + 7919)  # the groups' initial states
        demo = cfg.demo_starts
        self.demo_starts = DemoStarts(demo, ctx.data, ctx.seed) if demo.fraction > 0 else None
        self.from_demo = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.branch_starts = BranchStarts(cfg.branch_starts, ctx.seed) if cfg.branch_starts.fraction > 0 else None
        self.from_branch = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.task_sampler = TaskSampler(cfg.task_sampling, ctx.num_tasks, ctx.seed, self.name) \
            if cfg.task_sampling.by != "uniform" else None
        self._new_rollout()

    @staticmethod
    def build_policy(ctx: BuildContext) -> nn.Module:
        """The sampling policy: the VLA (``policy.arch=vla``) or a Gaussian actor."""
        obs_dim, act_dim = ctx.obs_space["policy"].shape[0], ctx.action_space.shape[0]
        if ctx.policy.arch == "vla":
            from embodied.vla.build import build_vla

            return build_vla(ctx, act_dim)
        return GaussianActor(obs_dim, act_dim, ctx.policy.actor_hidden, ctx.policy.activation,
                             ctx.policy.obs_normalization, image=ctx.image("policy"))

    @staticmethod
    def check(name: str, ctx: BuildContext, cfg, min_group: int = 2) -> None:
        """One clear line for settings the rollouts cannot run with (before the policy is built)."""
        group_size, temperature = cfg.group_size, cfg.temperature
        if not isinstance(ctx.action_space, gym.spaces.Box):
            raise UserError(f"{name} needs continuous (Box) actions")
        if group_size < min_group or ctx.num_envs % group_size:
            raise UserError(f"{name}: group_size >= {min_group} must divide num_envs; got group_size {group_size}, "
                            f"num_envs {ctx.num_envs}")
        if not ctx.success_metric:
            raise UserError(f"{name} rewards success: the task must report one (TaskSpec.success_metric)")
        if not temperature > 0:
            raise UserError(f"{name}: temperature > 0, got {temperature}")
        if cfg.branch_starts.source not in ("failed", "all"):
            raise UserError(f"{name}.branch_starts.source is failed or all, got {cfg.branch_starts.source!r}")

    @property
    def rollout_length(self) -> int:
        return 1_000_000  # the runner ends an episodic rollout once every env has finished an episode

    @property
    def records_env_states(self) -> bool:
        """Whether the runner hands it every env's state before each step (``record_env_states``)."""
        return self.branch_starts is not None

    def record_env_states(self, rows: torch.Tensor | None) -> None:
        self.branch_starts.record(rows)

    def rollout_starts(self):
        """Per-env seeds, groups of ``group_size`` sharing one (and their task, with ``task_sampling``); then the
        last groups from recorded states: first those from the last rollout's states (``branch_starts``), then those
        from the demonstrations'."""
        g = self.cfg.group_size
        groups = self.num_envs // g
        seeds = torch.randint(0, 2**31 - 1, (groups,), generator=self.seed_generator).repeat_interleave(g)
        tasks = self.task_sampler.sample(groups).repeat_interleave(g) if self.task_sampler is not None else None
        self._new_rollout()
        kd = round(self.cfg.demo_starts.fraction * groups) if self.demo_starts is not None else 0
        kb = 0
        if self.branch_starts is not None and self.branch_starts.available():
            kb = min(round(self.cfg.branch_starts.fraction * groups), groups - kd)
        self.from_demo.zero_()
        self.from_branch.zero_()
        if kd + kb == 0:
            return Starts(seeds, tasks=tasks)
        ids = torch.arange((groups - kd - kb) * g, self.num_envs)  # the last groups, each sharing one recorded state
        self.from_branch[ids[:kb * g].to(self.device)] = True
        self.from_demo[ids[kb * g:].to(self.device)] = True
        rows = [self.branch_starts.sample(kb)] if kb else []
        rows += [self.demo_starts.sample(kd)] if kd else []
        return Starts(seeds, (ids, torch.cat(rows).repeat_interleave(g, 0)), tasks)

    def _new_rollout(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []  # per step: packed obs, action, log_prob, valid
        self.ended = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.success = torch.zeros(self.num_envs, device=self.device)
        # each env's task in a suite (the outcome's ``TASK_ID``), -1 where the task reports none
        self.task_of = torch.full((self.num_envs,), -1, dtype=torch.long, device=self.device)
        # ``[N, 2]``: the entities each env's episode was instructed about (the outcome's ``INSTRUCTED``), -1 where
        # the task reports none
        self.instructed_of = torch.full((self.num_envs, 2), -1, dtype=torch.long, device=self.device)

    def dist(self, obs: torch.Tensor):
        """The tempered policy the rollouts sample from (and GRPO's ratio is taken under)."""
        return tempered(self.pi, obs, self.cfg.temperature)

    @torch.no_grad()
    def act(self, obs: Obs):
        dist = self.dist(obs["policy"])
        action = sample_action(dist, self.generator)
        return action, {"log_prob": dist.log_prob(action)}  # per token [N, act_dim]

    @torch.no_grad()
    def observe(self, tr: Transition) -> None:
        valid = ~self.ended  # steps of each env's first episode in this rollout
        self.steps.append({**self.packer.pack(tr.obs["policy"]), "action": tr.action,
                           "log_prob": tr.extras["log_prob"], "valid": valid.clone()})
        done = (tr.terminated | tr.truncated) & valid
        if bool(done.any()):
            outcome = (tr.outcome or {}).get(self.success_key)
            if outcome is None:
                raise UserError(f"{self.name}: the task reported no {self.success_key!r} outcome at an episode's end")
            self.success = torch.where(done, (outcome > 0.5).float(), self.success)
            task = tr.outcome.get(TASK_ID)
            if task is not None:
                self.task_of = torch.where(done, task.to(self.task_of), self.task_of)
            if INSTRUCTED[0] in tr.outcome:
                told = torch.stack([tr.outcome[k] for k in INSTRUCTED], 1).to(self.instructed_of)
                self.instructed_of = torch.where(done[:, None], told, self.instructed_of)
            self.ended |= done

    def take_steps(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The rollout's recorded steps as columns ``[T, N, ...]`` and their ``valid`` mask ``[T, N]``; the rollout's
        step list is emptied."""
        cols = {k: torch.stack([step[k] for step in self.steps]) for k in self.steps[0]}
        self.steps = []
        return cols, cols.pop("valid")

    def rollout_log(self, valid: torch.Tensor) -> dict[str, float]:
        """The rollout's figures (success over the fresh starts); grows the demonstration starts' window and keeps the
        candidate states of the next rollout's branch starts."""
        fresh = self.ended & ~self.from_demo & ~self.from_branch
        log = {f"{self.name}/rollout_success": float(self.success[fresh].mean()) if fresh.any() else 0.0,
               f"{self.name}/episode_steps": float(valid.sum())}
        if self.demo_starts is not None:
            log.update(self.demo_starts.update(self.success[self.ended & self.from_demo]))
        if self.task_sampler is not None and fresh.any():
            log.update(self.task_sampler.update(self.task_of[fresh], self.success[fresh]))
        if self.branch_starts is not None:
            branched = self.ended & self.from_branch
            if branched.any():
                log["branch_starts/success"] = float(self.success[branched].mean())
            source = fresh if self.cfg.branch_starts.source == "all" else fresh & (self.success < 0.5)
            self.branch_starts.close(valid, source)
            log["branch_starts/candidates"] = float(self.branch_starts.available())
        return log

    def actor(self) -> nn.Module:
        return self.pi

    def _start_parts(self) -> dict:
        """The optional parts that choose the rollouts' starts and keep state of their own, by checkpoint key."""
        parts = {"demo_starts": self.demo_starts, "branch_starts": self.branch_starts,
                 "task_sampler": self.task_sampler}
        return {k: v for k, v in parts.items() if v is not None}

    def rollout_state(self) -> dict:
        return {"pi": self.pi.state_dict(), "generator": self.generator.get_state(),
                "seed_generator": self.seed_generator.get_state(),
                **{k: part.state_dict() for k, part in self._start_parts().items()}}

    def load_rollout_state(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.generator.set_state(state["generator"])
        self.seed_generator.set_state(state["seed_generator"])
        for k, part in self._start_parts().items():
            if k in state:
                part.load_state_dict(state[k])


class GRPO(SuccessRollouts):
    name = "grpo"
    config_cls = GRPOConfig

    @classmethod
    def build(cls, cfg: GRPOConfig, ctx: BuildContext) -> GRPO:
        cls.check("grpo", ctx, cfg)
        if cfg.clip_low < 0 or cfg.clip_high < 0 or cfg.minibatch_tokens < 1:
            raise UserError("grpo: clip_low and clip_high >= 0, minibatch_tokens >= 1")
        return cls(cfg, ctx)

    def __init__(self, cfg: GRPOConfig, ctx: BuildContext):
        super().__init__(cfg, ctx)
        self.opt = torch.optim.Adam(self.pi.parameters(), lr=cfg.lr)
        self.batch_groups = cfg.batch_groups or ctx.num_envs // cfg.group_size
        self.demos = cotraining(cfg, ctx, self.pi, self.device, self.generator, "grpo")
        self.pending: list[dict[str, torch.Tensor]] = []  # kept groups' steps, waiting for an update
        self.fill_rollouts = 0
        self._kept_groups = 0  # mixed-outcome groups in ``pending``
        self.num_updates = 0

    def close_rollout(self) -> dict[str, float]:
        adv, keep = group_advantages(self.success, self.cfg.group_size)
        keep &= self.ended  # an episode cut short by the rollout's end has no outcome
        cols, valid = self.take_steps()
        mask = valid & keep[None]
        if bool(mask.any()):
            self.pending.append({**{k: v[mask] for k, v in cols.items()},
                                 "advantage": adv[None].expand_as(mask)[mask]})
        g = self.cfg.group_size
        self._kept_groups += int(keep.sum()) // g
        self.fill_rollouts += 1
        return {**self.rollout_log(valid), "grpo/mixed_groups": float(int(keep.sum()) // g),
                "grpo/groups": float(self.num_envs // g)}

    # ---- learning ----------------------------------------------------------------------------------
    def _take_batch(self) -> tuple[dict[str, torch.Tensor] | None, int]:
        """The kept steps of the rollouts closed since the last update, as one batch (None: none were kept), and the
        mixed groups they hold; dynamic sampling starts waiting afresh."""
        batch = {k: torch.cat([p[k] for p in self.pending]) for k in self.pending[0]} if self.pending else None
        kept = self._kept_groups
        self.pending, self.fill_rollouts, self._kept_groups = [], 0, 0
        return batch, kept

    def _surrogate(self, batch: dict[str, torch.Tensor], idx: torch.Tensor):
        """The tempered policy on the batch's rows ``idx``, their actions' log-probabilities ``[B, act_dim]`` and the
        per-token clipped surrogate."""
        dist = self.dist(self.packer.unpack_rows(batch, idx))
        logp = dist.log_prob(batch["action"][idx])
        surrogate = clipped_objective(logp, batch["log_prob"][idx], batch["advantage"][idx][:, None],
                                      self.cfg.clip_low, self.cfg.clip_high)
        return dist, logp, surrogate

    def update(self) -> dict[str, float]:
        log = self.close_rollout()
        if self._kept_groups < self.batch_groups and self.fill_rollouts < self.cfg.max_fill_rollouts:
            return log  # dynamic sampling: wait for more mixed groups
        batch, _ = self._take_batch()
        if batch is None:
            return {**log, "grpo/skipped_updates": 1.0}
        n, act_dim = batch["action"].shape
        per_step = max(1, self.cfg.minibatch_tokens // act_dim)
        stats = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0, "bc_loss": 0.0}
        count = 0
        for _ in range(self.cfg.num_epochs):
            order = torch.randperm(n, generator=self.generator, device=self.device)
            for start in range(0, n, per_step):
                idx = order[start:start + per_step]
                dist, logp, surrogate = self._surrogate(batch, idx)
                loss = -surrogate.mean()
                bc = torch.zeros(())
                if self.demos is not None:
                    bc = self.demos(self.pi, self.generator)
                    loss = loss + self.cfg.bc_coef * bc
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.pi.parameters(), self.cfg.max_grad_norm)
                self.opt.step()
                with torch.no_grad():
                    log_ratio = logp - batch["log_prob"][idx]
                    ratio = log_ratio.exp()
                    stats["loss"] += float(loss)
                    stats["clip_frac"] += float(((ratio < 1 - self.cfg.clip_low) |
                                                 (ratio > 1 + self.cfg.clip_high)).float().mean())
                    stats["approx_kl"] += float(((ratio - 1) - log_ratio).mean())
                    stats["entropy"] += float(dist.entropy().mean())
                    stats["bc_loss"] += float(bc)
                count += 1
        self.num_updates += 1
        return {**log, **{f"grpo/{k}": v / count for k, v in stats.items()}, "grpo/batch_steps": float(n)}

    def surrogate_gradient(self) -> tuple[torch.Tensor, int]:
        """The gradient of the clipped surrogate (to be maximized) over every kept step of the rollouts closed since
        the last update, at the policy that collected them (ratio 1: no clipping), flattened over the policy's
        parameters; and the mixed groups it rests on. Consumes those rollouts. A diagnostic of how much signal an
        update holds (``scripts/bench/bench_grpo_gradient.py``): the cosine between two batches' gradients."""
        params = list(self.pi.parameters())
        batch, kept = self._take_batch()
        self.pi.zero_grad(set_to_none=True)
        if batch is not None:
            n, act_dim = batch["action"].shape
            per_step = max(1, self.cfg.minibatch_tokens // act_dim)
            for start in range(0, n, per_step):
                _, _, surrogate = self._surrogate(batch, torch.arange(start, min(start + per_step, n),
                                                                      device=self.device))
                (surrogate.sum() / (n * act_dim)).backward()
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        self.pi.zero_grad(set_to_none=True)
        return grad, kept

    def state_dict(self) -> dict:
        return {**self.rollout_state(), "opt": self.opt.state_dict(), "pending": self.pending,
                "fill_rollouts": self.fill_rollouts, "kept_groups": self._kept_groups,
                "num_updates": self.num_updates}

    def load_state_dict(self, state: Mapping) -> None:
        self.load_rollout_state(state)
        self.opt.load_state_dict(state["opt"])
        self.pending = list(state["pending"])
        self.fill_rollouts, self._kept_groups = int(state["fill_rollouts"]), int(state["kept_groups"])
        self.num_updates = int(state["num_updates"])


ALGOS.register("grpo", GRPO)
