"""Soft Actor-Critic (Haarnoja et al. 2018) with twin critics, automatic entropy tuning and an
asymmetric critic (privileged ``critic`` observations).

Cadence follows RLtools' L2F SAC (../shared/reference/quadrotor.md 1.6): ``updates_per_step``
critic steps per env step, the actor and temperature every ``actor_every``-th critic step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from embodied.algos.base import policy_group
from embodied.algos.off_policy import OffPolicyAlgorithm, OffPolicyConfig
from embodied.config import PolicyConfig
from embodied.core.registry import ALGOS
from embodied.policies import SquashedGaussianActor


@dataclass
class SACConfig(OffPolicyConfig):
    lr_alpha: float = 1e-3
    init_alpha: float = 0.5
    target_entropy: float | None = None  # None: -act_dim


class SAC(OffPolicyAlgorithm):
    config_cls = SACConfig

    def _make_actor(self, obs_dim: int, act_dim: int, policy: PolicyConfig):
        self.log_alpha = torch.tensor(math.log(self.cfg.init_alpha), device=self.device, requires_grad=True)
        self.target_entropy = float(self.cfg.target_entropy if self.cfg.target_entropy is not None else -act_dim)
        return SquashedGaussianActor(obs_dim, act_dim, policy.actor_hidden, policy.activation, policy.obs_normalization,
                                     group=policy_group(policy, self.symmetry))

    def _extra_param_groups(self) -> list[dict]:
        return [{"params": [self.log_alpha], "lr": self.cfg.lr_alpha, "weight_decay": 0.0}]

    def _explore(self, obs: torch.Tensor) -> torch.Tensor:
        return self.pi.sample(obs, self.generator)[0]

    def _gradient_step(self) -> dict[str, torch.Tensor]:
        """One critic step and, every ``actor_every``-th call, one actor and temperature step, all
        from one sampled batch with a single backward pass:
            y       = r + d (min_j Q'_j(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
            L_Q     = 1/2 sum_j E[(Q_j(s, a) - y)^2]
            L_pi    = E[alpha log pi(a~|s) - min_j Q_j(s, a~)],  a~ ~ pi(s), Q's parameters held constant
            L_alpha = E[-log alpha (log pi(a~|s) + H_target)]
        The actor is evaluated once on [s; s'] (a' is detached). r and d = gamma^m (1 - terminated) are
        the row's m-step return and discount (m = 1 unless ``n_step`` > 1; replay.NStepReturns). With
        n_step > 1 the target holds only the entropy bonus of the bootstrap state, not of the states in
        between (not the soft n-step return); FastTD3's n-step returns are for TD3."""
        cfg = self.cfg
        b = self._sample()
        alpha = self.log_alpha.detach().exp()
        actor_step = self._actor_step()
        bsz = cfg.batch_size
        if actor_step:
            a_all, logp_all = self.pi.sample(torch.cat([b["obs"], b["next_obs"]]), self.generator)
            a_pi, logp_pi = a_all[:bsz], logp_all[:bsz]
            next_a, next_logp = a_all[bsz:].detach(), logp_all[bsz:].detach()
        else:
            with torch.no_grad():
                next_a, next_logp = self.pi.sample(b["next_obs"], self.generator)
        with torch.no_grad():
            q_next = self.q_target(b["next_cobs"], next_a).min(0).values - alpha * next_logp
            target = b["reward"] + b["discount"] * q_next
        q = self.q(b["cobs"], b["action"])  # [2, B]
        loss = q_loss = 0.5 * ((q - target) ** 2).mean(1).sum()
        metrics = {"sac/critic_loss": q_loss.detach(), "sac/q_mean": q.detach().mean(), "sac/alpha": alpha}
        if actor_step:
            q_pi = self.q(b["cobs"], a_pi, detach=True).min(0).values
            pi_loss = (alpha * logp_pi - q_pi).mean() + self._actor_penalty(a_pi, q_pi)
            alpha_loss = -(self.log_alpha * (logp_pi.detach() + self.target_entropy)).mean()
            loss = loss + pi_loss + alpha_loss
            metrics.update({"sac/actor_loss": pi_loss.detach(), "sac/entropy": -logp_pi.detach().mean()})
        self._apply(loss, actor_step)
        self._polyak(self._qt_params, self._q_params, cfg.tau)
        if actor_step:
            self._average_step()
        return metrics

    def state_dict(self) -> dict:
        return {**super().state_dict(), "log_alpha": self.log_alpha.detach().clone()}

    def load_state_dict(self, state: Mapping) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


ALGOS.register("sac", SAC)
