"""residual-ppo, residual-sac and residual-td3: a learner of a residual over a frozen base policy (``base=RUN_DIR``, any
run whose checkpoint holds a policy: BC, PPO, SAC...; or ``base=BUNDLE``, a deploy bundle of an MLP policy). ResiP's
settings: the residual is a policy on ``[obs, base action]`` whose mean starts at exactly zero, scaled by ``scale``
in normalized action units and bounded by ``limit``; so the deterministic combined policy acts exactly as the base at
step 0. residual-ppo keeps ResiP's 0.1; residual-sac and residual-td3 default to 0.5, the bound a BC base's large
errors need (``ResidualOffPolicyConfig``), with a start that keeps so large a residual from wrecking the base early.

The learner sees the MDP of ``([obs, base action], residual)`` (the base action is a function of the observation, so
this is the task's MDP seen through the base): its rollouts or replay store the residual as the action; the env
receives the combined action. ``actor()`` is the combined policy (``ResidualActor``): evaluation, ``load_policy``,
checkpoints and export see base and residual as one. One mixin, ``Residual``, over the unchanged PPO, SAC and TD3."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from embodied.algos.base import BuildContext, Obs, Transition, critic_dim, critic_obs, split_act
from embodied.algos.ppo import PPO, PPOConfig
from embodied.algos.sac import SAC, SACConfig
from embodied.algos.td3 import TD3, TD3Config
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS
from embodied.policies import ResidualActor, policy_spec


@dataclass
class ResidualPPOConfig(PPOConfig):
    # residual units per normalized action unit (ResiP's action_scale): one number, or a list of one per action
    # dimension (``scale=[0.1,0.1,0.1,0.1,0.1,0.1,2.0]``)
    scale: Any = 0.1
    limit: Any = 0.1  # the added residual's bound per action dimension, in normalized action units (the same forms)
    init_log_std: float = -1.0  # ResiP's run script
    # ResiP's PPO (base_residual_rl.yaml): many full-batch epochs up to a wide KL, long horizon. Our PPO's 5 epochs
    # of 4 minibatches moved the small residual by an approx. KL of 0.003 an update: pick-place at 100k env steps
    # 0.56 (BC 0.51); these settings 0.60
    num_epochs: int = 50
    num_minibatches: int = 1
    target_kl: float | None = 0.1
    gamma: float = 0.999
    value_coef: float = 1.0
    reads: str = "obs"  # what the residual reads besides the base action: obs, or grounded (ResidualOffPolicyConfig)


@dataclass
class ResidualOffPolicyConfig:
    """What residual-sac and residual-td3 set alike (listed first among their configs' bases: these defaults win)."""

    # pick-place over its 51% BC base needs corrections of ~0.5 (scripts/bench/bench_residual_ceiling.py: the
    # expert's correction clipped to 0.1 lifts it to 64%, to 0.5 to 87%), so the residual may reach 0.5; what keeps
    # so large a residual from wrecking the base early is the start below (seed 0, 150k env steps: 75%, against 51%
    # for scale 0.1 with SAC's own start and 1-3% for scale 0.5 with it)
    scale: Any = 0.5
    limit: Any = 0.5
    updates_per_step: float = 0.5
    # the critic's TD errors are large here (success +10 and drops -10 among -0.5 step costs): lr 1e-3 gave
    # 58/52/71/70/65/78% every 25k env steps, 3e-4 58/58/68/70/74/75% (seed 0; 300k at 1e-3: 65%)
    lr_actor: float = 3e-4
    lr_critic: float = 3e-4
    critic_burn_in: int = 25_000  # the critic learns the base's values before the actor moves
    # Policy Decorator's progressive exploration: over the first ``explore_ramp`` env steps each env step applies
    # the residual's sample with probability rising linearly from 0 to 1 (otherwise the base acts alone and the
    # replay stores a zero residual); 0: always applied
    explore_ramp: int = 0
    # TD3+BC's form of a trust region around the base: the actor's loss adds
    # residual_penalty * mean|Q| * mean(r^2) (r the residual in [-1, 1]), so the residual grows only where the
    # critic's gain outweighs it (without it, dimensions the task ignores drift to |r| ~ 0.5); 0: none
    residual_penalty: float = 0.2
    # what the residual reads besides the base action: obs (the task's policy observation), or grounded: the base's
    # view of the objects its instruction names (a VLA with entity pointers: the proprioception and the entries of
    # the objects its first two pointers pick; ``VLAPolicy.grounded``): an MLP residual over a multi-task
    # language-conditioned base cannot tell from the observation which cube the instruction means
    reads: str = "obs"


@dataclass
class ResidualSACConfig(ResidualOffPolicyConfig, SACConfig):
    # SAC's 0.5 pays more for the residual's entropy than a tabletop task pays per step for progress
    init_alpha: float = 0.1
    # the squashed actor's initial log-std (its log-std rows start at zero weights and this bias: exploration of
    # ~scale * e^-2 about the base); None: the network's random initialization (std ~1 before tanh: a residual of
    # +-scale at random from step 0)
    init_log_std: float | None = -2.0


@dataclass
class ResidualTD3Config(ResidualOffPolicyConfig, TD3Config):
    # a deterministic residual: its critic values the policy that evaluation runs (SAC's values its samples), with
    # Gaussian exploration of exploration_noise (residual units) about it; the torch step (the numba one has no
    # residual penalty)
    kernel: str = "torch"


def load_base(path: str, obs_dim: int, act_dim: int) -> dict:
    """The policy spec and weights of the run or deploy bundle at ``path``, checked against the task's dimensions.
    A bundle's policy is its ONNX graph read back as a program (``ProgramPolicy``)."""
    from pathlib import Path

    from embodied.checkpoint import load_checkpoint

    if not path:
        raise UserError("a residual learner needs base=RUN_DIR or base=BUNDLE: the frozen policy it corrects")
    bundle = Path(path) if Path(path).name == "bundle.json" else Path(path) / "bundle.json"
    if bundle.is_file():
        import onnx

        from embodied.hardware.bundle import read_bundle
        from embodied.hardware.onnx_export import program_from_onnx
        from embodied.policies import ChunkedProgramPolicy, ProgramPolicy

        meta = read_bundle(bundle)
        ops, n_obs = program_from_onnx(onnx.load(str(meta["dir"] / "policy.onnx")))
        chunk = meta["policy"].get("chunk")
        policy = ChunkedProgramPolicy(ops, n_obs, int(meta["policy"]["act_dim"]), **chunk) if chunk else \
            ProgramPolicy(ops, n_obs, int(meta["policy"]["act_dim"]))
        spec, state = policy_spec(policy), policy.state_dict()
        dims = n_obs, int(meta["policy"]["act_dim"])
    else:
        ckpt = load_checkpoint(path)
        try:
            spec, state = ckpt["policy"]["spec"], ckpt["policy"]["state"]
            dims = spec["kwargs"]["obs_dim"], spec["kwargs"]["act_dim"]
        except (KeyError, TypeError):
            raise UserError(f"the checkpoint in {path} holds no policy a residual can wrap") from None
    if dims != (obs_dim, act_dim):
        raise UserError(f"the base policy at {path} reads {dims[0]} observation entries and acts on {dims[1]}; "
                        f"this task has {obs_dim} / {act_dim}")
    return {"spec": spec, "state": state}


def _check_per_dimension(name: str, key: str, value, act_dim: int) -> None:
    """``value``: a number > 0, or a list of ``act_dim`` of them; else one ``UserError`` line."""
    many = isinstance(value, (list, tuple))
    values = list(value) if many else [value]
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    if not ok or (many and len(values) != act_dim):
        raise UserError(f"{name}.{key} must be a number > 0 or a list of {act_dim} of them (one per action "
                        f"dimension), got {value!r}")


class Residual:
    """What residual-ppo and residual-sac add to their learner (listed first among the bases)."""

    critic_reads_base = False  # the critic's input holds the base action (a Q critic; PPO's V(s) has it in s)

    @classmethod
    def build(cls, cfg, ctx: BuildContext):
        if not isinstance(ctx.action_space, gym.spaces.Box) or ctx.image("policy") is not None:
            raise UserError(f"{cls.name} needs continuous actions and state observations")
        if ctx.policy.symmetrize:
            raise UserError(f"{cls.name}: the residual's input holds the base action; policy.symmetrize=false")
        obs_dim, act_dim = ctx.obs_space["policy"].shape[0], ctx.action_space.shape[0]
        for key in ("scale", "limit"):
            _check_per_dimension(cls.name, key, getattr(cfg, key), act_dim)
        base = load_base(ctx.base, obs_dim, act_dim)
        spaces = dict(ctx.obs_space.spaces)
        spaces["policy"] = gym.spaces.Box(-np.inf, np.inf, (cls._input_dim(cfg, base, obs_dim) + act_dim,),
                                          np.float32)
        # the critic reads the task's critic observation (or the policy's); a Q critic also the base action: the env
        # acts b + scale * r, so with b in its input a critic of (s, r) need not learn the base's function
        extra = act_dim if cls.critic_reads_base else 0
        spaces["critic"] = gym.spaces.Box(-np.inf, np.inf, (critic_dim(ctx.obs_space) + extra,), np.float32)
        # the residual is an MLP on [obs, base action] whatever policy.arch says (a task whose default policy is the
        # VLA: that names the base's kind, which the base's own checkpoint records)
        policy = dataclasses.replace(ctx.policy, arch="mlp")
        algo = super().build(cfg, dataclasses.replace(ctx, obs_space=gym.spaces.Dict(spaces), policy=policy))
        algo.task_obs_dim = obs_dim
        algo._attach(base, act_dim)
        if hasattr(algo, "load_demos"):  # an off-policy residual's demonstration rows need the base: loaded now
            algo.load_demos(ctx.data)
        return algo

    @classmethod
    def _input_dim(cls, cfg, base: dict, obs_dim: int) -> int:
        """What the residual reads besides the base action: the observation's size, or the base's grounded view's."""
        if cfg.reads == "obs":
            return obs_dim
        if cfg.reads != "grounded":
            raise UserError(f"{cls.name}.reads is obs or grounded, got {cfg.reads!r}")
        from embodied.policies import build_policy

        probe = build_policy(base["spec"])
        if getattr(probe, "pointers", None) is None:
            raise UserError(f"{cls.name}.reads=grounded needs a base that points at the objects its instruction "
                            "names (policy.arch=vla policy.vla.state_encoder=pointers)")
        with torch.no_grad():
            return int(probe.grounded(torch.zeros(1, obs_dim)).shape[1])

    demos_at_build = False

    def _last_layer(self) -> nn.Linear:
        """The residual network's output layer (its mean rows first; a squashed actor's log-std rows after them)."""
        return [m for m in self.pi.net.modules() if isinstance(m, nn.Linear)][-1]

    def _attach(self, base: dict, act_dim: int) -> None:
        last = self._last_layer()
        with torch.no_grad():  # the residual's mean starts at exactly zero (a squashed actor's log-std rows stay)
            last.weight[:act_dim].zero_()
            last.bias[:act_dim].zero_()
        self.combined = ResidualActor(base["spec"], policy_spec(self.pi), self.cfg.scale, self.cfg.limit,
                                      self.cfg.reads)
        self.combined.base.load_state_dict(base["state"])
        # one module: what the learner trains (or, with deploy_average, its average) is what the combined policy runs
        self.combined.residual = self.pi if getattr(self, "pi_average", None) is None else self.pi_average
        self.combined.to(self.device)

    def _augment(self, obs: Obs, b: torch.Tensor | None = None) -> tuple[Obs, torch.Tensor]:
        """The learner's observations: ``[obs, b]`` for the policy, the critic's (with ``b`` if it reads the base),
        ``b`` the base action given where ``act`` made it, else the one the base would give (chunk queues kept)."""
        if b is None:
            b = self.combined.base_action(obs["policy"], peek=True)
        critic = torch.cat([critic_obs(obs), b], -1) if self.critic_reads_base else critic_obs(obs)
        return {**obs, "policy": self.combined.residual_input(obs["policy"], b), "critic": critic}, b

    @torch.no_grad()
    def _demo_rows(self, obs, cobs, action, next_obs, next_cobs) -> tuple[torch.Tensor, ...]:
        """Demonstration rows in the residual's MDP: ``[obs, b]`` with ``b`` the base's action from ``obs``
        (``start_action``), and the residual that turns ``b`` into the demonstrated action as far as the bound lets
        it: ``r = clip((a - b) / scale, -limit / scale, limit / scale)``, within [-1, 1]."""
        if obs.shape[1] != self.task_obs_dim:
            raise UserError(f"the demonstrations have {obs.shape[1]} observation entries per step; the base policy "
                            f"reads {self.task_obs_dim}")
        scale, limit = self.combined._scale.to(obs.device), self.combined._limit.to(obs.device)
        b, next_b = (self.combined.start_action(o.to(self.device)).to(obs.device) for o in (obs, next_obs))
        bound = limit / scale
        r = torch.maximum(torch.minimum((action - b) / scale, bound), -bound).clamp(-1.0, 1.0)
        if self.critic_reads_base:
            cobs, next_cobs = torch.cat([cobs, b], -1), torch.cat([next_cobs, next_b], -1)
        inputs = (self.combined.residual_input(o.to(self.device), a.to(self.device)).to(obs.device)
                  for o, a in ((obs, b), (next_obs, next_b)))
        return next(inputs), cobs, r, next(inputs), next_cobs

    @torch.no_grad()
    def act(self, obs: Obs):
        aug, b = self._augment(obs)
        r, extras = split_act(super().act(aug))
        r = self._gate(r)
        return self.combined.combine(b, r), {**extras, "residual": r, "base": b}

    def _gate(self, r: torch.Tensor) -> torch.Tensor:
        """The residual the env receives this step (all of it, unless a learner ramps its exploration in)."""
        return r

    @torch.no_grad()
    def observe(self, tr: Transition) -> None:
        aug, _ = self._augment(tr.obs, tr.extras["base"])  # the base acted on tr.obs in act: not run again
        next_aug, _ = self._augment(tr.next_obs)
        self.combined.reset(tr.terminated | tr.truncated)  # a chunked base starts the new episodes' chunks afresh
        super().observe(dataclasses.replace(tr, obs=aug, next_obs=next_aug, action=tr.extras["residual"]))

    def actor(self) -> nn.Module:
        super().actor()  # an averaged residual's input scaling follows the learner's
        return self.combined


class ResidualPPO(Residual, PPO):
    name, config_cls = "residual-ppo", ResidualPPOConfig


class ResidualOffPolicy(Residual):
    """What residual-sac and residual-td3 add to the residual: a Q critic that reads the base action, warm-up from the
    residual's own samples, the penalty that keeps the residual near zero, the progressive exploration."""

    critic_reads_base = True

    def _attach(self, base: dict, act_dim: int) -> None:
        super()._attach(base, act_dim)
        self._start_rows(act_dim)
        # the actor's copies made at build (deploy_average's average, TD3's target actor) start as the residual as
        # built: zero mean
        for copy in (getattr(self, "pi_target", None), self.pi_average):
            if copy is not None:
                copy.load_state_dict(self.pi.state_dict())

    def _start_rows(self, act_dim: int) -> None:
        """What a learner sets in its residual's last layer besides the zero mean (nothing here)."""

    def _warmup_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The residual's own samples (zero mean at first), not uniform ones: a uniform residual of +-scale is an
        arbitrary perturbation of the base, which at a large scale wrecks every warm-up episode."""
        return self._explore(obs)

    def _actor_penalty(self, a_pi: torch.Tensor, q_pi: torch.Tensor) -> torch.Tensor | float:
        if self.cfg.residual_penalty <= 0:
            return 0.0
        return self.cfg.residual_penalty * q_pi.detach().abs().mean() * a_pi.pow(2).mean()

    def _gate(self, r: torch.Tensor) -> torch.Tensor:
        ramp = self.cfg.explore_ramp
        if ramp <= 0 or self.num_observed >= ramp:
            return r
        keep = torch.rand(r.shape[0], 1, generator=self.generator, device=r.device) < self.num_observed / ramp
        return r * keep


class ResidualSAC(ResidualOffPolicy, SAC):
    name, config_cls = "residual-sac", ResidualSACConfig

    def _start_rows(self, act_dim: int) -> None:
        if self.cfg.init_log_std is not None:  # the squashed actor's log-std rows: zero weights, this bias
            last = self._last_layer()
            with torch.no_grad():
                last.weight[act_dim:].zero_()
                last.bias[act_dim:].fill_(self.cfg.init_log_std)


class ResidualTD3(ResidualOffPolicy, TD3):
    name, config_cls = "residual-td3", ResidualTD3Config

    def _make_kernel(self, seed: int):
        if self.cfg.kernel != "torch":
            raise UserError("residual-td3 runs the torch step only (residual-td3.kernel=torch): the numba step has "
                            "no residual penalty")
        return None


ALGOS.register("residual-ppo", ResidualPPO)
ALGOS.register("residual-sac", ResidualSAC)
ALGOS.register("residual-td3", ResidualTD3)
