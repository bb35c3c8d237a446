"""APPO: PPO for data collected by an engine that simulates ahead (``runtime.engine=async|ray``), whose
actions may come from a policy some updates older than the learner's (Sample Factory's APPO; IMPALA's
V-trace, Espeholt et al. 2018). The one change to PPO: advantages and value targets are V-trace's,
computed against the current policy and critic, so off-policy (lagged) steps are corrected by truncated
importance weights instead of being treated as on-policy. The clipped surrogate's ratio stays relative
to the behaviour policy, as in APPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embodied.algos.gae import vtrace
from embodied.algos.ppo import PPO, PPOConfig
from embodied.core.registry import ALGOS


@dataclass
class APPOConfig(PPOConfig):
    rho_bar: float = 1.0  # truncation of the importance weights in the V-trace TD errors
    c_bar: float = 1.0  # truncation of the trace-cutting coefficients


class APPO(PPO):
    config_cls = APPOConfig

    def _targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        s, cfg = self.storage, self.cfg
        log_target = self.pi.dist(s.obs).log_prob(s.actions).sum(-1)  # current policy, [T, N]
        values = self.v(s.cobs)  # current critic
        vs, adv = vtrace(s.rewards, values, s.dones, self.v(self._next_cobs), log_target - s.log_probs,
                         cfg.gamma, cfg.rho_bar, cfg.c_bar)
        return adv, vs


ALGOS.register("appo", APPO)
