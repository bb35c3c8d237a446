"""TD3 (Fujimoto et al. 2018): deterministic actor, twin critics with clipped double-Q, target
policy smoothing and delayed actor/target updates, with an asymmetric critic. This is the learner
of "Learning to Fly in Seconds" (../shared/reference/quadrotor.md 1.4): its deterministic actor is
trained on exactly the action it is evaluated with, which matters for a quadrotor whose thrust is
convex in rpm (a stochastic SAC policy gets more mean thrust in training than its mean action
gives at evaluation, and the deterministic policy then hovers low)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from embodied.algos.base import MAIN_STREAM, Transition, deterministic_actor
from embodied.algos.noise import ar1_step, check_correlation
from embodied.algos.off_policy import OffPolicyAlgorithm, OffPolicyConfig
from embodied.config import PolicyConfig
from embodied.core.errors import UserError
from embodied.core.registry import ALGOS


@dataclass
class TD3Config(OffPolicyConfig):
    exploration_noise: float = 0.1  # std of Gaussian noise on collected actions
    # FastTD3's mixed noise: each env's std drawn from U[exploration_noise, exploration_noise_max] and
    # redrawn when its episode ends, so the batch explores at several scales at once (None: one std)
    exploration_noise_max: float | None = None
    # the exploration noise's step-to-step correlation rho in [0, 1): each env's noise an AR(1) process through its
    # episode, n_t = rho n_{t-1} + sqrt(1 - rho^2) e_t (e_t standard normal, so n_t stays standard normal), fresh at
    # each episode's start, times the env's std. 0: white noise, the draws of plain TD3. quadrotor-hover (stop 79):
    # randomized plants, 2000 strict starts after 300k steps, seeds 0-4 0.9438 mean at 0.9 against 0.9441 white
    # (0.97: seeds 0-1 0.9465 / 0.9435 against 0.946 / 0.939); nominal seeds 0-9 process wall median 20.3 s against
    # 18.1 s (every seed solved either way): left off
    noise_correlation: float = 0.0
    target_noise: float = 0.2  # target policy smoothing std
    target_noise_clip: float = 0.5
    # the gradient step: ``numba`` (embodied/kernels/td3_numba.py: the same step in two compiled calls, ~3x faster
    # at the quadrotor's sizes), ``torch`` (the reference), ``auto`` (numba where it supports the learner: a CPU
    # learner, relu or tanh, no observation normalization; torch otherwise). The two draw different random numbers
    kernel: str = "auto"
    # the numba step's threads, each on a slice of the batch (None: torch_threads)
    kernel_threads: int | None = None


class TD3(OffPolicyAlgorithm):
    config_cls = TD3Config

    def __init__(self, cfg: TD3Config, policy: PolicyConfig, obs_space, action_space, num_envs: int,
                 device: torch.device, seed: int, total_steps: int | None = None, symmetry=None):
        super().__init__(cfg, policy, obs_space, action_space, num_envs, device, seed, total_steps, symmetry)
        self._fused = self._make_kernel(seed)

    def _make_kernel(self, seed: int):
        """The numba step's view of this learner, or None for the torch step (``td3.kernel``)."""
        from embodied.algos import td3_kernel

        kernel = self.cfg.kernel
        if kernel not in td3_kernel.KERNELS:
            raise UserError(f"td3.kernel={kernel!r}: one of {', '.join(td3_kernel.KERNELS)}")
        if kernel == "torch" or type(self)._gradient_step is not TD3._gradient_step:
            return None
        why = td3_kernel.unsupported(self)
        if why is not None:
            if kernel == "numba":
                raise UserError(f"td3.kernel=numba does not support {why}; use td3.kernel=torch (or auto)")
            return None
        return td3_kernel.FusedStep(self, seed)

    def _make_actor(self, obs_dim: int, act_dim: int, policy: PolicyConfig):
        actor = deterministic_actor(policy, obs_dim, act_dim, self.symmetry)
        self.pi_target = copy.deepcopy(actor).to(self.device).requires_grad_(False)
        self._pit_params = list(self.pi_target.parameters())
        hi = self.cfg.exploration_noise_max
        if hi is not None and hi < self.cfg.exploration_noise:
            raise UserError(f"td3.exploration_noise_max={hi} is below "
                            f"td3.exploration_noise={self.cfg.exploration_noise}")
        check_correlation("td3.noise_correlation", self.cfg.noise_correlation)
        self.noise_std = torch.full((self.num_envs, 1), self.cfg.exploration_noise, device=self.device)
        # the correlated noise of each env's episode (standard normal) and which envs start a new one at their next step
        self.noise = torch.zeros(self.num_envs, act_dim, device=self.device)
        self.noise_fresh = torch.ones(self.num_envs, 1, dtype=torch.bool, device=self.device)
        self._redraw_noise(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return actor

    def _make_average(self) -> nn.Module:
        if self.cfg.average_tau is not None:  # an average at its own rate: a copy of its own
            return super()._make_average()
        return self.pi_target  # already the Polyak average of the actor (tau, on the delayed steps)

    def _average_step(self) -> None:
        if self.pi_average is not self.pi_target:
            super()._average_step()

    def actor_loaded(self) -> None:
        # a warm-started actor's target starts as that actor, not as the random one it was copied from at build
        super().actor_loaded()
        self.pi_target.load_state_dict(self.pi.state_dict())

    def _redraw_noise(self, envs: torch.Tensor) -> None:
        lo, hi = self.cfg.exploration_noise, self.cfg.exploration_noise_max
        if hi is None or not bool(envs.any()):
            return
        u = torch.rand(self.num_envs, 1, generator=self.generator, device=self.device)
        self.noise_std = torch.where(envs[:, None], lo + (hi - lo) * u, self.noise_std)

    def _explore(self, obs: torch.Tensor) -> torch.Tensor:
        a = self._fused.act(obs) if self._fused is not None else self.pi.act(obs)
        # per-env noise scales belong to the run's own envs; another collector's (a model's rollouts) get the base
        own = obs.shape[0] == self.num_envs
        std = self.noise_std if own else self.cfg.exploration_noise
        noise = torch.randn(a.shape, generator=self.generator, device=self.device)
        rho = self.cfg.noise_correlation
        if own and rho > 0:
            self.noise = ar1_step(self.noise, noise, rho, restart=self.noise_fresh)
            self.noise_fresh.zero_()
            noise = self.noise
        return (a + noise * std).clamp(-1.0, 1.0)

    def observe(self, tr: Transition) -> None:
        super().observe(tr)
        if tr.stream == MAIN_STREAM:
            ended = tr.terminated | tr.truncated
            self._redraw_noise(ended)
            self.noise_fresh |= ended[:, None]

    def _gradient_step(self) -> dict[str, torch.Tensor]:
        """    a'   = clip(pi'(s') + clip(N(0, s~), -c, c), -1, 1)
            y    = r + d min_j Q'_j(s', a'),  d = gamma^m (1 - terminated) for an m-step row
            L_Q  = 1/2 sum_j E[(Q_j(s, a) - y)^2]
            L_pi = -E[Q_1(s, pi(s))] (+ ``_actor_penalty``) every ``actor_every``-th step (Q's parameters held
                   constant),
        then the targets move by Polyak averaging on those same steps."""
        cfg = self.cfg
        actor_step = self._actor_step()
        delayed = (self.num_updates + 1) % cfg.actor_every == 0  # the targets' cadence (also during a burn-in)
        if self._fused is not None and self.demos is None:
            self._fused.draw()
            metrics = self._fused.step(actor_step, delayed)
            if actor_step:  # an average at its own rate (the kernel moves the target actor, not this copy)
                self._average_step()
            self.num_updates += 1
            return metrics
        b = self._sample()
        self._sync_inputs(self.pi_target)  # the rows are the actor's inputs
        with torch.no_grad():
            next_mu = self.pi_target(b["next_obs"])
            eps = self._target_noise(next_mu.shape) * cfg.target_noise
            next_a = (next_mu + eps.clamp(-cfg.target_noise_clip, cfg.target_noise_clip)).clamp(-1.0, 1.0)
            target = b["reward"] + b["discount"] * self.q_target(b["next_cobs"], next_a).min(0).values
        q = self.q(b["cobs"], b["action"])  # [2, B]
        loss = q_loss = 0.5 * ((q - target) ** 2).mean(1).sum()
        metrics = {"td3/critic_loss": q_loss.detach(), "td3/q_mean": q.detach().mean()}
        if actor_step:
            a_pi = self.pi(b["obs"])
            q_pi = self.q(b["cobs"], a_pi, detach=True)[0]
            pi_loss = -q_pi.mean() + self._actor_penalty(a_pi, q_pi)
            loss = loss + pi_loss
            metrics["td3/actor_loss"] = pi_loss.detach()
        self._apply(loss, actor_step)
        if actor_step:
            self._average_step()
        if delayed:
            self._polyak(self._qt_params, self._q_params, cfg.tau)
            self._polyak(self._pit_params, self._pi_params, cfg.tau)
        return metrics

    def _target_noise(self, shape: torch.Size) -> torch.Tensor:
        """N(0, 1) draws for target policy smoothing (scaled and clipped by the caller)."""
        return torch.randn(shape, generator=self.generator, device=self.device)

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "pi_target": self.pi_target.state_dict(), "noise_std": self.noise_std.clone(),
                 "noise": self.noise.clone(), "noise_fresh": self.noise_fresh.clone()}
        if self._fused is not None:
            state["kernel_rng"] = torch.from_numpy(self._fused.rng.view(np.int64).copy())
        return state

    def load_state_dict(self, state: Mapping) -> None:
        super().load_state_dict(state)
        self.pi_target.load_state_dict(state["pi_target"])
        if "noise_std" in state:
            self.noise_std = state["noise_std"].to(self.device)
        if "noise" in state:
            self.noise = state["noise"].to(self.device)
            self.noise_fresh = state["noise_fresh"].to(self.device)
        if self._fused is not None and "kernel_rng" in state:
            self._fused.rng[:] = state["kernel_rng"].numpy().view(np.uint64)


ALGOS.register("td3", TD3)
