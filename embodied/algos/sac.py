"""Soft Actor-Critic (Haarnoja et al. 2018) with twin critics, automatic entropy tuning, an
asymmetric critic (privileged ``critic`` observations) and a replay buffer on the learner device.

Cadence follows RLtools' L2F SAC (../shared/reference/quadrotor.md 1.6): ``updates_per_step``
critic steps per env step, the actor and temperature every ``actor_every``-th critic step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from embodied.algos.base import Algorithm, Obs, Transition, critic_dim, critic_obs
from embodied.config import PolicyConfig, SACConfig
from embodied.core.registry import ALGOS
from embodied.policies import SquashedGaussianActor, TwinQCritic


class ReplayBuffer:
    """Circular buffer of transitions in one ``[capacity, width]`` tensor, so that a sample is a
    single gather (a gather per field cost ~7x more per update on CPU); fields are column slices."""

    def __init__(self, capacity: int, obs_dim: int, cobs_dim: int, act_dim: int, device: torch.device):
        self.capacity, self.size, self.pos = int(capacity), 0, 0
        widths = {"obs": obs_dim, "cobs": cobs_dim, "action": act_dim, "reward": 1, "done": 1,
                  "next_obs": obs_dim, "next_cobs": cobs_dim}
        self.slices, start = {}, 0
        for k, w in widths.items():
            self.slices[k] = slice(start, start + w)
            start += w
        self.storage = torch.zeros(self.capacity, start, device=device)

    def add(self, **batch: torch.Tensor) -> None:
        n = batch["reward"].shape[0]
        row = torch.cat([batch[k].reshape(n, -1) for k in self.slices], 1)
        if n > self.capacity:  # only the newest `capacity` rows survive; keep the slot they would take
            self.pos = (self.pos + n - self.capacity) % self.capacity
            self.size = min(self.size + n - self.capacity, self.capacity)
            row, n = row[-self.capacity:], self.capacity
        end = self.pos + n
        if end <= self.capacity:
            self.storage[self.pos:end] = row
        else:
            first = self.capacity - self.pos
            self.storage[self.pos:] = row[:first]
            self.storage[: n - first] = row[first:]
        self.pos = end % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        idx = torch.randint(self.size, (batch_size,), generator=generator, device=generator.device)
        rows = self.storage.index_select(0, idx)
        out = {k: rows[:, s] for k, s in self.slices.items()}
        out["reward"] = out["reward"].squeeze(1)
        out["done"] = out["done"].squeeze(1)
        return out

    def state_dict(self) -> dict:
        return {"size": self.size, "pos": self.pos, "capacity": self.capacity,
                "storage": self.storage[: self.size].clone()}

    def load_state_dict(self, state: Mapping) -> None:
        size, pos, rows = int(state["size"]), int(state["pos"]), state["storage"]
        if int(state.get("capacity", self.capacity)) != self.capacity:
            # the buffer was sized for another budget (a resumed run that extends total_steps):
            # lay the rows out oldest first, keep the newest that fit, continue after them
            if size == int(state["capacity"]):
                rows = torch.cat([rows[pos:], rows[:pos]])
            rows = rows[-self.capacity:]
            size = rows.shape[0]
            pos = size % self.capacity
        self.size, self.pos = size, pos
        self.storage[:size] = rows


class SAC(Algorithm):
    def __init__(self, cfg: SACConfig, policy: PolicyConfig, obs_space, action_space, num_envs: int,
                 device: torch.device, seed: int, total_steps: int | None = None):
        self.cfg, self.device, self.num_envs = cfg, torch.device(device), num_envs
        obs_dim, cdim = obs_space["policy"].shape[0], critic_dim(obs_space)
        act_dim = action_space.shape[0]
        self.act_dim = act_dim
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        torch.manual_seed(seed)  # network initialization
        self.pi = SquashedGaussianActor(obs_dim, act_dim, policy.actor_hidden, policy.activation,
                                        policy.obs_normalization).to(self.device)
        self.q = TwinQCritic(cdim, act_dim, policy.critic_hidden, policy.activation).to(self.device)
        self.q_target = TwinQCritic(cdim, act_dim, policy.critic_hidden, policy.activation).to(self.device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=self.device, requires_grad=True)
        self.target_entropy = float(cfg.target_entropy if cfg.target_entropy is not None else -act_dim)
        # one fused Adam over three groups: a single optimizer call per gradient step (CPU dispatch
        # overhead, not FLOPs, dominates these small networks)
        self.opt = torch.optim.Adam(
            [{"params": list(self.q.parameters()), "lr": cfg.lr_critic, "weight_decay": cfg.weight_decay},
             {"params": list(self.pi.parameters()), "lr": cfg.lr_actor, "weight_decay": cfg.weight_decay},
             {"params": [self.log_alpha], "lr": cfg.lr_alpha, "weight_decay": 0.0}],
            fused=True)
        capacity = min(cfg.buffer_size, total_steps) if total_steps else cfg.buffer_size
        self.buffer = ReplayBuffer(capacity, obs_dim, cdim, act_dim, self.device)
        self.num_observed = 0  # env steps stored
        self.num_updates = 0  # critic gradient steps
        self._credit = 0.0  # fractional critic steps owed (updates_per_step * env steps)
        self._q_params = list(self.q.parameters())
        self._qt_params = list(self.q_target.parameters())
        self._pi_params = list(self.pi.parameters())

    # ---- verbs -------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        o = obs["policy"]
        if self.num_observed < self.cfg.warmup_steps:
            return torch.rand(o.shape[0], self.act_dim, generator=self.generator, device=self.device) * 2 - 1
        return self.pi.sample(o, self.generator)[0]

    def observe(self, tr: Transition) -> None:
        if isinstance(self.pi.normalizer, nn.Module) and hasattr(self.pi.normalizer, "update"):
            self.pi.normalizer.update(tr.obs["policy"])
        self.buffer.add(obs=tr.obs["policy"], cobs=critic_obs(tr.obs), action=tr.action, reward=tr.reward,
                        done=tr.terminated.float(), next_obs=tr.next_obs["policy"], next_cobs=critic_obs(tr.next_obs))
        n = tr.reward.shape[0]
        self.num_observed += n
        if self.num_observed >= self.cfg.warmup_steps and self.buffer.size >= self.cfg.batch_size:
            self._credit += n * self.cfg.updates_per_step

    def update(self) -> dict[str, torch.Tensor]:
        metrics: dict[str, torch.Tensor] = {}
        while self._credit >= 1.0:
            self._credit -= 1.0
            metrics = self._gradient_step()
        return metrics

    def actor(self) -> nn.Module:
        return self.pi

    # ---- learning ----------------------------------------------------------------------------
    def _clip(self, params) -> None:
        if self.cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm, foreach=True)

    def _gradient_step(self) -> dict[str, torch.Tensor]:
        """One critic step and, every ``actor_every``-th call, one actor and temperature step, all
        from one sampled batch with a single backward pass:
            y       = r + gamma (1 - terminated) (min_j Q'_j(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
            L_Q     = 1/2 sum_j E[(Q_j(s, a) - y)^2]
            L_pi    = E[alpha log pi(a~|s) - min_j Q_j(s, a~)],  a~ ~ pi(s), Q's parameters held constant
            L_alpha = E[-log alpha (log pi(a~|s) + H_target)]
        The actor is evaluated once on [s; s'] (a' is detached)."""
        cfg = self.cfg
        b = self.buffer.sample(cfg.batch_size, self.generator)
        alpha = self.log_alpha.detach().exp()
        actor_step = (self.num_updates + 1) % cfg.actor_every == 0
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
            target = b["reward"] + cfg.gamma * (1.0 - b["done"]) * q_next
        q = self.q(b["cobs"], b["action"])  # [2, B]
        loss = q_loss = 0.5 * ((q - target) ** 2).mean(1).sum()
        metrics = {"sac/critic_loss": q_loss.detach(), "sac/q_mean": q.detach().mean(), "sac/alpha": alpha}
        if actor_step:
            pi_loss = (alpha * logp_pi - self.q(b["cobs"], a_pi, detach=True).min(0).values).mean()
            alpha_loss = -(self.log_alpha * (logp_pi.detach() + self.target_entropy)).mean()
            loss = loss + pi_loss + alpha_loss
            metrics.update({"sac/actor_loss": pi_loss.detach(), "sac/entropy": -logp_pi.detach().mean()})
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self._clip(self._q_params)
        if actor_step:
            self._clip(self._pi_params)
        self.opt.step()
        self.num_updates += 1
        with torch.no_grad():  # Polyak: theta' <- theta' + tau (theta - theta')
            torch._foreach_lerp_(self._qt_params, self._q_params, cfg.tau)
        return metrics

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "pi": self.pi.state_dict(), "q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(), "opt": self.opt.state_dict(),
            "buffer": self.buffer.state_dict(), "generator": self.generator.get_state(),
            "num_observed": self.num_observed, "num_updates": self.num_updates, "credit": self._credit,
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.opt.load_state_dict(state["opt"])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.set_state(state["generator"])
        self.num_observed = int(state["num_observed"])
        self.num_updates = int(state["num_updates"])
        self._credit = float(state["credit"])


ALGOS.register("sac", SAC)
