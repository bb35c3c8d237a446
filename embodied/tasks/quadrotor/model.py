"""quadrotor-hover as a differentiable function of its state, plant and the actor's actions: what an analytic policy
gradient (backpropagation through time, Heeg et al. 2024 "Learning quadrotor control from differentiable
simulation") runs through. The same physics (``kernels/quadrotor.py``'s RK4), observation (``clean_observation``,
the action history, the position average, the noise) and reward terms (``reward_terms``) as the env's torch path;
``tests/tasks/test_quadrotor_model.py`` checks that a rollout here is the env's, entry for entry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from embodied.kernels.quadrotor import rk4_step_torch
from embodied.tasks.quadrotor.hover import (
    QuadrotorHoverEnv,
    advance_average,
    clean_observation,
    observation_noise,
    reward_terms,
    rpm_command,
)


@dataclass
class Flight:
    """Where each of a batch of model flights is: state ``x [N, 17]``, plant ``p [N, 13]``, the observation noise's
    factor ``[N]``, the action history ``[N, 4 * history]``, the position average as of the last observation
    ``[N, 3]`` (or ``[N, 0]``) and the steps flown since the start ``[N]``."""

    x: torch.Tensor
    p: torch.Tensor
    noise_scale: torch.Tensor
    history: torch.Tensor
    average: torch.Tensor
    steps: torch.Tensor

    def parts(self) -> list[torch.Tensor]:
        """The fields in order (``dataclasses.astuple`` would deep-copy them, graph and all)."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def detach(self) -> Flight:
        return Flight(*(t.detach() for t in self.parts()))

    def where(self, mask: torch.Tensor, other: Flight) -> Flight:
        """``other``'s rows where ``mask [N]``, this one's elsewhere."""
        pick = lambda a, b: torch.where(mask.view(-1, *([1] * (a.dim() - 1))), b, a)  # noqa: E731
        return Flight(*(pick(a, b) for a, b in zip(self.parts(), other.parts())))


@dataclass
class Rollout:
    """``[H, N]`` per step: the reward's shaped terms summed (no floor, no termination penalty) and the margin to the
    termination radius after the step (the radius less the distance from the set-point: < 0 where the env's episode
    would have ended); ``states [H + 1, N, 17]`` from the start; ``end``: the flights after the last step."""

    reward: torch.Tensor
    margin: torch.Tensor
    states: torch.Tensor
    end: Flight


class HoverModel:
    """Differentiable rollouts of ``env``'s task from states and plants of its own (``starts``), with ``env``'s
    settings: parameters, noise, history length, position average and its current reward weights."""

    def __init__(self, env: QuadrotorHoverEnv):
        self.env = env
        self.dt, self.rpm_max = env.params.dt, env.params.rpm_max
        self.episode_steps = env.max_episode_steps

    def starts(self, seed: int) -> Flight:
        """``env``'s initial distribution, one flight per env (``env`` is reset with ``seed``), as an episode starts:
        the history holds the command that keeps mid-range rpm (zeros), no position is averaged yet."""
        env = self.env
        env.reset(seed=seed)
        x = env.sim.x.clone()
        n = x.shape[0]
        return Flight(x, env.sim.p.clone(), env.noise_scale.clone(), torch.zeros_like(env.actions),
                      x.new_zeros(n, env.pos_average.shape[1]), torch.zeros(n, dtype=torch.long, device=x.device))

    def rollout(self, actor, flight: Flight, horizon: int, generator: torch.Generator | None) -> Rollout:
        """``horizon`` steps of ``actor`` (``actor(obs) -> action`` in [-1, 1], with its graph) from ``flight``; the
        observation noise from ``generator`` (None: noise-free). No episode ends: a flight past the termination
        radius goes on (its margin says so)."""
        env = self.env
        x, p, scale, hist, average, steps = flight.parts()
        rewards, margins, states = [], [], [x]
        for _ in range(horizon):
            clean = clean_observation(x)
            observed = clean if generator is None else clean + observation_noise(clean, env.obs_noise_std, scale,
                                                                                  generator)
            parts = [observed, hist]
            if average.shape[1]:
                average = advance_average(average, observed[:, :3], steps == 0, env.position_decay)
                parts.append(average)
            action = actor(torch.cat(parts, 1))
            a = action.clamp(-1.0, 1.0)
            hist = torch.cat([hist[:, 4:], a], 1)
            u = rpm_command(a, self.rpm_max).clamp(0.0, self.rpm_max)  # clipped as QuadrotorSim.step clips
            x = rk4_step_torch(x, p, u, self.dt)
            steps = steps + 1
            dist = x[:, 0:3].norm(dim=1)
            rewards.append(sum(reward_terms(env.weights, x, dist, action, env.hover_action).values()))
            margins.append(env.cfg.termination_radius - dist)
            states.append(x)
        return Rollout(torch.stack(rewards), torch.stack(margins), torch.stack(states),
                       Flight(x, p, scale, hist, average, steps))

