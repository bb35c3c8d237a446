"""Proximal Policy Optimization (Schulman et al. 2017), every detail visible in one place:
GAE, clipped surrogate, advantage normalization, optional value clipping, KL early stop,
asymmetric critic input, truncation bootstrapping, and observation normalization in the modules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from embodied.algos.base import ON_POLICY, Algorithm, BuildContext, Obs, Transition, critic_dim, critic_obs
from embodied.algos.cotrain import CotrainConfig, cotraining
from embodied.algos.gae import explained_variance, gae
from embodied.algos.optim import anneal_linear, check_lr_schedule
from embodied.config import PolicyConfig
from embodied.core.errors import UserError
from embodied.core.pixels import PixelPacker
from embodied.core.registry import ALGOS
from embodied.policies import GaussianActor, ValueCritic, update_normalizer
from embodied.policies.actor_critic import CategoricalActor, sample_action
from embodied.policies.normalizer import EmpiricalNormalizer


@dataclass
class PPOConfig(CotrainConfig):
    num_steps: int = 32  # rollout horizon per env per iteration
    num_epochs: int = 5
    num_minibatches: int = 4
    lr: float = 3e-4
    lr_schedule: str = "constant"  # constant | linear (to 0 at total_steps, CleanRL's anneal_lr)
    adam_eps: float = 1e-8  # 1e-5 as CleanRL/SB3 PPO: damps Adam's near-sign steps once gradients get tiny
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2  # surrogate ratio clip
    value_clip: float | None = None  # clip value updates to +-this (None: off)
    target_kl: float | None = 0.02  # stop the epoch loop when approx KL exceeds this (None: off)
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    # updates in which only the critic learns (VLA-RL's critic warm-up: a fine-tuned actor is not steered by a
    # random critic's advantages)
    critic_warmup: int = 0
    max_grad_norm: float = 1.0
    init_log_std: float = -0.5
    normalize_advantages: bool = True
    # divide rewards by the running std of the discounted return (gymnasium's NormalizeReward, which
    # CleanRL's MuJoCo PPO uses): keeps value targets O(1) whatever the task's reward scale. On by
    # default: with returns of O(100) (pendulum) Adam's bounded per-parameter step leaves the critic
    # behind each shift of the state distribution, advantages become critic error and a learned
    # policy collapses (docs/architecture.md, "PPO and the scale of the value targets")
    normalize_rewards: bool = True


class RolloutStorage:
    """``[T, N, ...]`` tensors for one rollout. The policy observations are held packed (``packer``: camera entries
    as uint8, core/pixels.py): ``put_obs`` stores a step, ``obs_rows`` gives rows of the flattened rollout back."""

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, cobs_dim: int, act_dim: int, device,
                 packer: PixelPacker | None = None):
        t, n = num_steps, num_envs
        z = lambda *s: torch.zeros(t, n, *s, device=device)  # noqa: E731
        self.packer = packer or PixelPacker(obs_dim)
        self.packed = {k: torch.zeros(t, n, v.shape[-1], dtype=v.dtype, device=device)
                       for k, v in self.packer.pack(torch.zeros(1, obs_dim)).items()}
        self.cobs, self.actions = z(cobs_dim), z(act_dim)
        self.log_probs, self.values, self.rewards, self.dones = z(), z(), z(), z()
        self.step = 0
        self.num_steps = num_steps

    def full(self) -> bool:
        return self.step >= self.num_steps

    def put_obs(self, t: int, obs: torch.Tensor) -> None:
        for k, v in self.packer.pack(obs).items():
            self.packed[k][t] = v

    @property
    def obs(self) -> torch.Tensor:
        """The whole rollout's policy observations ``[T, N, D]``, as floats."""
        return self.packer.unpack(self.packed)

    def obs_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` of the rollout flattened to ``[T * N, D]``, as floats."""
        return self.packer.unpack_rows({k: v.reshape(-1, v.shape[-1]) for k, v in self.packed.items()}, idx)


class PPO(Algorithm):
    paradigm = ON_POLICY
    config_cls = PPOConfig

    @classmethod
    def build(cls, cfg: PPOConfig, ctx: BuildContext) -> PPO:
        if ctx.policy.symmetrize:
            raise UserError("policy.symmetrize is implemented for the off-policy learners (td3, sac), not ppo; "
                            "add policy.symmetrize=false")
        critic_group = "critic" if "critic" in ctx.obs_space.spaces else "policy"
        actor = None
        if ctx.policy.arch == "vla":  # the language-conditioned policy; the critic stays a separate network
            from embodied.vla.build import build_vla

            if not isinstance(ctx.action_space, gym.spaces.Box):
                raise UserError("policy.arch=vla needs continuous (Box) actions")
            actor = build_vla(ctx, ctx.action_space.shape[0])
        algo = cls(cfg, ctx.policy, ctx.obs_space, ctx.action_space, ctx.num_envs, ctx.device, ctx.seed,
                   total_steps=ctx.total_steps, image=ctx.image("policy"), critic_image=ctx.image(critic_group),
                   actor=actor, packer=PixelPacker.of(ctx.layout, "policy", ctx.obs_space["policy"].shape[0]))
        algo.demos = cotraining(cfg, ctx, algo.pi, algo.device, algo.generator, "ppo")
        return algo

    @property
    def rollout_length(self) -> int:
        return self.cfg.num_steps

    def __init__(self, cfg: PPOConfig, policy: PolicyConfig, obs_space, action_space, num_envs: int,
                 device: torch.device, seed: int, total_steps: int | None = None, image: list | None = None,
                 critic_image: list | None = None, actor: nn.Module | None = None, packer: PixelPacker | None = None):
        self.cfg, self.device = cfg, torch.device(device)
        obs_dim, cdim, act_dim = obs_space["policy"].shape[0], critic_dim(obs_space), action_space.shape[0]
        discrete = isinstance(action_space, gym.spaces.MultiDiscrete)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        torch.manual_seed(seed)  # network initialization
        if actor is not None:  # built by the caller (a VLA)
            self.pi = actor.to(self.device)
        elif discrete:  # a categorical head per dimension (GSDrive's anchor actions, any discrete task)
            self.pi = CategoricalActor(obs_dim, action_space.nvec.tolist(), policy.actor_hidden, policy.activation,
                                       policy.obs_normalization, image=image).to(self.device)
        else:
            self.pi = GaussianActor(obs_dim, act_dim, policy.actor_hidden, policy.activation,
                                    policy.obs_normalization, cfg.init_log_std, image=image).to(self.device)
        self.v = ValueCritic(cdim, policy.critic_hidden, policy.activation, policy.obs_normalization,
                             image=critic_image).to(self.device)
        self.params = [*self.pi.parameters(), *self.v.parameters()]
        check_lr_schedule("ppo.lr_schedule", cfg.lr_schedule)
        self.opt = torch.optim.Adam(self.params, lr=cfg.lr, eps=cfg.adam_eps)
        self.demos = None  # co-training on demonstrations (``bc_coef``), set by ``build``
        self.total_steps, self.batch_steps = total_steps, num_envs * cfg.num_steps
        self.storage = RolloutStorage(cfg.num_steps, num_envs, obs_dim, cdim, act_dim, self.device, packer)
        self._next_cobs: torch.Tensor | None = None
        self.num_updates = 0
        self.return_norm = EmpiricalNormalizer(1).to(self.device)  # statistics of the discounted return
        self._discounted = torch.zeros(num_envs, device=self.device)  # per env, reset at episode ends

    @torch.no_grad()
    def act(self, obs: Obs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dist = self.pi.dist(obs["policy"])
        action = sample_action(dist, self.generator)
        return action, {"log_prob": dist.log_prob(action).sum(-1), "value": self.v(critic_obs(obs))}

    @torch.no_grad()
    def observe(self, tr: Transition) -> None:
        s, t = self.storage, self.storage.step
        log_prob, value = tr.extras["log_prob"], tr.extras["value"]
        reward = self._scale_rewards(tr.reward, tr.terminated | tr.truncated)
        # time-limit truncation is not failure: bootstrap r + gamma V(s_final) (Pardo et al. 2018)
        boot = tr.truncated & ~tr.terminated
        if boot.any():
            reward = reward + self.cfg.gamma * boot.float() * self.v(critic_obs(tr.next_obs))
        s.put_obs(t, tr.obs["policy"])
        s.cobs[t], s.actions[t] = critic_obs(tr.obs), tr.action
        s.log_probs[t], s.values[t], s.rewards[t] = log_prob, value, reward
        s.dones[t] = (tr.terminated | tr.truncated).float()
        s.step += 1
        self._next_cobs = critic_obs(tr.next_obs)
        update_normalizer(self.pi, tr.obs["policy"])
        if hasattr(self.v.normalizer, "update"):
            self.v.normalizer.update(critic_obs(tr.obs))

    def _targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and value targets ``[T, N]`` of the stored rollout (GAE)."""
        s = self.storage
        return gae(s.rewards, s.values, s.dones, self.v(self._next_cobs), self.cfg.gamma, self.cfg.gae_lambda)

    def _scale_rewards(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """r / sqrt(Var[G] + eps) with G_t = gamma G_{t-1} + r_t, the running discounted return."""
        if not self.cfg.normalize_rewards:
            return reward.clone()
        self._discounted = self._discounted * self.cfg.gamma + reward
        self.return_norm.update(self._discounted[:, None])
        self._discounted = self._discounted * (~done).float()
        return reward / torch.sqrt(self.return_norm.var[0] + self.return_norm.eps)

    def update(self) -> dict[str, float]:
        s, cfg = self.storage, self.cfg
        if not s.full():
            return {}
        with torch.no_grad():
            adv, returns = self._targets()
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
        cobs, actions = flat(s.cobs), flat(s.actions)
        old_logp, old_values, adv, returns = flat(s.log_probs), flat(s.values), flat(adv), flat(returns)
        batch = actions.shape[0]
        mb = batch // cfg.num_minibatches
        if cfg.lr_schedule == "linear" and self.total_steps:  # by the env steps done before this update
            anneal_linear(self.opt.param_groups, [cfg.lr] * len(self.opt.param_groups),
                          self.num_updates * self.batch_steps, self.total_steps)
        stats = {"ppo/policy_loss": 0.0, "ppo/value_loss": 0.0, "ppo/entropy": 0.0, "ppo/approx_kl": 0.0,
                 "ppo/clip_frac": 0.0}
        count, stop = 0, False
        for _ in range(cfg.num_epochs):
            perm = torch.randperm(batch, generator=self.generator, device=self.device)
            for i in range(cfg.num_minibatches):
                idx = perm[i * mb:(i + 1) * mb]
                out = self._minibatch_loss(s.obs_rows(idx), cobs[idx], actions[idx], old_logp[idx], old_values[idx],
                                           adv[idx], returns[idx])
                loss, kl = out["loss"], out["ppo/approx_kl"]
                if cfg.target_kl is not None and kl > 1.5 * cfg.target_kl:
                    stop = True  # KL early stop: this minibatch moved the policy too far
                    break
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.opt.step()
                for k in stats:
                    stats[k] += float(out[k])
                count += 1
            if stop:
                break
        s.step = 0
        self.num_updates += 1
        out = {k: v / max(count, 1) for k, v in stats.items()}
        out["ppo/minibatches"] = float(count)
        out["ppo/lr"] = float(self.opt.param_groups[0]["lr"])
        ev = explained_variance(old_values, returns)  # the critic at collection against this rollout's targets
        if ev is not None:
            out["ppo/explained_variance"] = ev
        if hasattr(self.pi, "log_std"):
            out["ppo/std"] = float(self.pi.log_std.detach().exp().mean())
        return out

    def _minibatch_loss(self, obs, cobs, actions, old_logp, old_values, adv, returns) -> dict:
        cfg = self.cfg
        if cfg.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        dist = self.pi.dist(obs)
        logp = dist.log_prob(actions).sum(-1)
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        # L^CLIP = -E[min(r A, clip(r, 1-eps, 1+eps) A)]
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv).mean()
        values = self.v(cobs)
        if cfg.value_clip is not None:
            clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
            value_loss = torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()
        else:
            value_loss = ((values - returns) ** 2).mean()
        entropy = dist.entropy().sum(-1).mean()
        if self.num_updates < cfg.critic_warmup:  # a warm-started actor waits until the critic has learned
            policy_loss, entropy = policy_loss * 0.0, entropy * 0.0
        loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
        if self.demos is not None and self.num_updates >= cfg.critic_warmup:
            loss = loss + cfg.bc_coef * self.demos(self.pi, self.generator)
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator (Schulman 2020)
            clip_frac = ((ratio - 1).abs() > cfg.clip).to(ratio.dtype).mean()  # samples the clip acted on
        return {"loss": loss, "ppo/policy_loss": policy_loss.detach(), "ppo/value_loss": value_loss.detach(),
                "ppo/entropy": entropy.detach(), "ppo/approx_kl": float(approx_kl), "ppo/clip_frac": float(clip_frac)}

    def actor(self) -> nn.Module:
        return self.pi

    def state_dict(self) -> dict:
        return {"pi": self.pi.state_dict(), "v": self.v.state_dict(), "opt": self.opt.state_dict(),
                "generator": self.generator.get_state(), "num_updates": self.num_updates,
                "return_norm": self.return_norm.state_dict(), "discounted": self._discounted.clone()}

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.v.load_state_dict(state["v"])
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.num_updates = int(state["num_updates"])
        self.return_norm.load_state_dict(state["return_norm"])
        self._discounted = state["discounted"].to(self.device)


ALGOS.register("ppo", PPO)
