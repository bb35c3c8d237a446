"""dreamer-ac: DreamerV3's actor-critic (Hafner et al. 2023; reference subsystems.md 2.2) on imagined experience.

It learns from segments of ``horizon`` consecutive steps of every stream it observes. Run on ``wm:<task>`` with
``env.mode=dream`` it sees only the learned model's rollouts (the model env is the off-policy runner's second
collector), which is DreamerV3's learning in imagination with the model stepped as an environment:

- lambda-returns over the segment, bootstrapped with the critic (``segment_lambda_returns``);
- the critic regresses two-hot symlog targets (255 bins, zero-initialized output) to the returns, plus a pull
  toward a slow EMA copy of itself (``slow_reg``; rate ``slow_rate``);
- the actor follows REINFORCE with advantages ``(R - V) / max(1, S)``, ``S`` the EMA of the 95th minus the 5th
  return percentile (small returns are not blown up), plus an entropy bonus;
- one gradient step per segment, so the data is at most ``horizon`` updates old.

With ``actor_grad=dynamics`` (DreamerV1/V2's gradient for continuous actions) the actor instead maximizes the
lambda-return of its own rollouts through the learned model, differentiated through the model's steps: from
``starts`` observed states, ``horizon`` reparameterized actions and model steps (``attach_model``: the world-model
run hands the learner its ensemble), ``R_t = r_t + gamma c_t ((1 - lam) V(s_t+1) + lam R_t+1)`` with
``c = 1 - p_terminal`` and ``R_H = V(s_H)``, loss ``-sum_t w_t R_t / max(1, S)`` with ``w_t`` the product of the
``gamma c`` before ``t``; the critic also regresses those returns (detached). Until a model is attached the actor
does not move.

Deviations: the actor's Gaussian has a state-independent std (the PPO actor, so export is the same) instead of
DreamerV3's bounded-std head; with ``actor_grad=reinforce`` the model is not differentiated through (DreamerV3
uses REINFORCE for every action space)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from embodied.algos.base import OFF_POLICY, Algorithm, BuildContext, Obs, Transition, critic_dim, critic_obs
from embodied.algos.returns import PercentileScale, imagined_lambda_returns, segment_lambda_returns
from embodied.config import PolicyConfig
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS
from embodied.policies import GaussianActor, update_normalizer
from embodied.policies.actor_critic import sample_action
from embodied.policies.networks import mlp
from embodied.policies.normalizer import EmpiricalNormalizer
from embodied.sim_backends.world_model.tricks import TwoHot


@dataclass
class DreamerACConfig:
    lr_actor: float = 3e-4
    lr_critic: float = 1e-3  # the two-hot critic starts at 0 (zero-initialized) and must catch up with the returns
    gamma: float = 0.99  # DreamerV3: 1 - 1/333
    lam: float = 0.95
    horizon: int = 15  # steps per segment (DreamerV3's imag_length)
    entropy: float = 3e-4  # DreamerV3's actent
    slow_rate: float = 0.02
    slow_reg: float = 1.0
    retnorm_rate: float = 0.01
    retnorm_limit: float = 1.0
    max_grad_norm: float = 10.0
    warmup_steps: int = 0  # observed steps with uniform random actions
    init_log_std: float = -0.5
    actor_grad: str = "reinforce"  # reinforce | dynamics (backpropagate returns through the attached model)
    starts: int = 256  # dynamics: imagined rollouts per gradient step, from observed states of the segment


class TwoHotCritic(nn.Module):
    """V(s) as logits over two-hot symlog bins; ``value`` decodes them."""

    def __init__(self, obs_dim: int, hidden: list[int], activation: str, normalize: bool):
        super().__init__()
        self.normalizer = EmpiricalNormalizer(obs_dim) if normalize else nn.Identity()
        self.twohot = TwoHot()
        self.net = mlp(obs_dim, list(hidden), self.twohot.bins.numel(), activation, out_gain=0.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalizer(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.twohot.decode(self(obs))


class DreamerAC(Algorithm):
    paradigm = OFF_POLICY
    config_cls = DreamerACConfig

    @classmethod
    def build(cls, cfg: DreamerACConfig, ctx: BuildContext) -> DreamerAC:
        if ctx.image("policy") is not None:
            raise UserError("dreamer-ac reads state observations; image tasks train in a latent model (not yet)")
        if not isinstance(ctx.action_space, gym.spaces.Box):
            raise UserError("dreamer-ac needs continuous (Box) actions")
        if cfg.horizon < 1 or not 0 <= cfg.lam <= 1 or not 0 < cfg.gamma <= 1:
            raise UserError("dreamer-ac: horizon >= 1, lam in [0, 1], gamma in (0, 1]")
        if cfg.actor_grad not in ("reinforce", "dynamics") or cfg.starts < 1:
            raise UserError(f"dreamer-ac: actor_grad must be reinforce or dynamics (got {cfg.actor_grad!r}), "
                            f"starts >= 1 (got {cfg.starts})")
        if cfg.actor_grad == "dynamics" and not ctx.learned_model:
            raise UserError("dreamer-ac.actor_grad=dynamics backpropagates through the model a wm:<task> run learns "
                            "while training (no env.model=): use it there, or actor_grad=reinforce")
        return cls(cfg, ctx.policy, ctx.obs_space, ctx.action_space, ctx.num_envs, ctx.device, ctx.seed)

    def __init__(self, cfg: DreamerACConfig, policy: PolicyConfig, obs_space, action_space, num_envs: int,
                 device: torch.device, seed: int):
        self.cfg, self.device, self.num_envs = cfg, torch.device(device), num_envs
        self.act_dim = action_space.shape[0]
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        torch.manual_seed(seed)
        self.pi = GaussianActor(obs_space["policy"].shape[0], self.act_dim, policy.actor_hidden, policy.activation,
                                policy.obs_normalization, cfg.init_log_std).to(self.device)
        self.v = TwoHotCritic(critic_dim(obs_space), policy.critic_hidden, policy.activation,
                              policy.obs_normalization).to(self.device)
        self.v_slow = copy.deepcopy(self.v).requires_grad_(False)
        self.opt = torch.optim.Adam([{"params": self.pi.parameters(), "lr": cfg.lr_actor},
                                     {"params": self.v.parameters(), "lr": cfg.lr_critic}], eps=1e-5)
        self.retnorm = PercentileScale(cfg.retnorm_rate, cfg.retnorm_limit, device=self.device)
        self.segments: dict[str, list[dict[str, torch.Tensor]]] = {}  # per stream, steps not learned from yet
        self.num_observed = 0
        self.num_updates = 0
        self.model = None  # a differentiable model of the env (attach_model), for actor_grad=dynamics

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        o = obs["policy"]
        if self.num_observed < self.cfg.warmup_steps:
            return torch.rand(o.shape[0], self.act_dim, generator=self.generator, device=self.device) * 2 - 1
        return sample_action(self.pi.dist(o), self.generator)

    @torch.no_grad()
    def observe(self, tr: Transition) -> None:
        update_normalizer(self.pi, tr.obs["policy"])
        if hasattr(self.v.normalizer, "update"):
            self.v.normalizer.update(critic_obs(tr.obs))
        groups = {f"group/{k}": v for k, v in tr.obs.items()} if self.cfg.actor_grad == "dynamics" else {}
        self.segments.setdefault(tr.stream, []).append({
            **groups,  # every observation group: imagined rollouts start from them
            "obs": tr.obs["policy"], "cobs": critic_obs(tr.obs), "action": tr.action, "reward": tr.reward,
            "terminated": tr.terminated, "done": tr.terminated | tr.truncated, "next_cobs": critic_obs(tr.next_obs)})
        self.num_observed += tr.reward.shape[0]

    def update(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for steps in self.segments.values():
            while len(steps) >= self.cfg.horizon:
                seg = {k: torch.stack([s[k] for s in steps[: self.cfg.horizon]], 1) for k in steps[0]}
                del steps[: self.cfg.horizon]
                metrics = self._gradient_step(seg)
        return metrics

    def _gradient_step(self, seg: dict[str, torch.Tensor]) -> dict[str, float]:
        """One step on a segment ``[N, H, ...]``."""
        cfg = self.cfg
        with torch.no_grad():
            next_value = self.v.value(seg["next_cobs"])
            ret = segment_lambda_returns(seg["reward"], seg["terminated"], seg["done"], next_value, cfg.gamma, cfg.lam)
            if cfg.actor_grad == "reinforce":  # with dynamics gradients S follows the imagined returns
                self.retnorm.update(ret)
            slow = self.v_slow.value(seg["cobs"])
        logits = self.v(seg["cobs"])
        value = self.v.twohot.decode(logits)
        critic_loss = (self.v.twohot.loss(logits, ret) + cfg.slow_reg * self.v.twohot.loss(logits, slow)).mean()
        self.opt.zero_grad(set_to_none=True)
        if cfg.actor_grad == "dynamics":
            actor_loss, entropy, imagined = self._dynamics_actor_loss(seg)
            if imagined is not None:  # the critic also learns the imagined returns of the current actor
                cobs, target = imagined
                critic_loss = critic_loss + self.v.twohot.loss(self.v(cobs), target).mean()
        else:
            adv = ((ret - value) / self.retnorm.scale).detach()
            dist = self.pi.dist(seg["obs"])
            logp = dist.log_prob(seg["action"]).sum(-1)
            entropy = dist.entropy().sum(-1)
            actor_loss = -(logp * adv).mean() - cfg.entropy * entropy.mean()
        # the actor's loss reaches the critic's and the model's inputs, never their weights
        params = [q for q in self.pi.parameters() if q.requires_grad]
        for q, g in zip(params, torch.autograd.grad(actor_loss, params, allow_unused=True)):
            q.grad = g
        critic_loss.backward()
        nn.utils.clip_grad_norm_(self.pi.parameters(), cfg.max_grad_norm)
        nn.utils.clip_grad_norm_(self.v.parameters(), cfg.max_grad_norm)
        self.opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(self.v_slow.parameters()), list(self.v.parameters()), cfg.slow_rate)
            for b_slow, b in zip(self.v_slow.buffers(), self.v.buffers()):
                b_slow.copy_(b)
        self.num_updates += 1
        return {"dreamer/actor_loss": float(actor_loss.detach()), "dreamer/critic_loss": float(critic_loss.detach()),
                "dreamer/return": float(ret.mean()), "dreamer/return_scale": float(self.retnorm.scale),
                "dreamer/entropy": float(entropy.mean().detach()), "dreamer/value": float(value.mean().detach())}

    def attach_model(self, model) -> None:
        self.model = model

    def _dynamics_actor_loss(self, seg: dict[str, torch.Tensor]):
        """The actor's loss through ``horizon`` model steps from observed states of ``seg`` (module docstring); also
        the imagined critic inputs and their detached lambda-returns ``(cobs [K, B, C], R [K, B])``, or None."""
        cfg = self.cfg
        entropy = self.pi.dist(seg["obs"][:, :1].flatten(0, 1)).entropy().sum(-1)
        if self.model is None:  # no model yet: the actor waits
            return entropy.mean() * 0.0, entropy, None
        groups = [k[len("group/"):] for k in seg if k.startswith("group/")]
        flat = {k: seg[f"group/{k}"].flatten(0, 1) for k in groups}
        pick = torch.randint(flat["policy"].shape[0], (min(cfg.starts, flat["policy"].shape[0]),),
                             generator=self.generator, device=self.device)
        obs = {k: v[pick] for k, v in flat.items()}
        cobs, rewards, conts = [critic_obs(obs)], [], []
        for _ in range(cfg.horizon):
            dist = self.pi.dist(obs["policy"])
            eps = torch.randn(dist.mean.shape, generator=self.generator, device=self.device)
            action = dist.mean + dist.stddev * eps
            obs, reward, p_terminal = self.model.imagine_step(obs, action, self.generator)
            cobs.append(critic_obs(obs))
            rewards.append(reward)
            conts.append(1.0 - p_terminal)
        values = self.v.value(torch.stack(cobs))  # [H + 1, B]
        ret = imagined_lambda_returns(torch.stack(rewards), torch.stack(conts), values, cfg.gamma, cfg.lam)
        discount = torch.cumprod(torch.stack([torch.ones_like(conts[0])] + [cfg.gamma * c for c in conts[:-1]]), 0)
        scale = self.retnorm.update(ret)
        loss = -(discount.detach() * ret).mean() / scale - cfg.entropy * entropy.mean()
        return loss, entropy, (torch.stack(cobs[:-1]).detach(), ret.detach())

    def actor(self) -> nn.Module:
        return self.pi

    def state_dict(self) -> dict:
        return {"pi": self.pi.state_dict(), "v": self.v.state_dict(), "v_slow": self.v_slow.state_dict(),
                "opt": self.opt.state_dict(), "retnorm": self.retnorm.state_dict(),
                "generator": self.generator.get_state(), "num_observed": self.num_observed,
                "num_updates": self.num_updates,
                "segments": {k: [dict(s) for s in v] for k, v in self.segments.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.v.load_state_dict(state["v"])
        self.v_slow.load_state_dict(state["v_slow"])
        self.opt.load_state_dict(state["opt"])
        self.retnorm.load_state_dict(state["retnorm"])
        self.generator.set_state(state["generator"])
        self.num_observed, self.num_updates = int(state["num_observed"]), int(state["num_updates"])
        self.segments = {k: [dict(s) for s in v] for k, v in state["segments"].items()}


ALGOS.register("dreamer-ac", DreamerAC)
