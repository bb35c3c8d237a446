"""quadrotor-hover's differentiable model (embodied/tasks/quadrotor/model.py) is the env's torch path: the same
observations, states and rewards step for step, and autograd's gradient through a rollout is the finite-difference
one."""

import dataclasses

import torch
from torch import nn

import embodied
from embodied.tasks.quadrotor.model import Flight, HoverModel

NOISELESS = dict(obs_noise_position=0.0, obs_noise_orientation=0.0, obs_noise_lin_vel=0.0, obs_noise_ang_vel=0.0)


def actor_for(env, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    dim = env.single_observation_space["policy"].shape[0]
    return nn.Sequential(nn.Linear(dim, 32), nn.Tanh(), nn.Linear(32, 4), nn.Tanh()).to(dtype)


class Recorder(nn.Module):
    """The actor, keeping every observation it was shown."""

    def __init__(self, actor):
        super().__init__()
        self.actor, self.seen = actor, []

    def forward(self, obs):
        self.seen.append(obs.detach().clone())
        return self.actor(obs)


def test_a_model_rollout_is_the_env_step_for_step():
    # randomized plants, disturbances, no guided starts; no noise (the env and the model draw it from other
    # generators) and no floor (the env's reward is then the terms' sum)
    env = embodied.make_env("quadrotor-hover", num_envs=64, kernel="torch", init_guidance=0.0, **NOISELESS,
                            domain_randomization={"enabled": True}, reward={"floor": None})
    model = HoverModel(env)
    starts = model.starts(seed=3)
    actor = Recorder(actor_for(env))
    with torch.no_grad():  # two legs of 20 steps: the second goes on from where the first ended
        first = model.rollout(actor, starts, horizon=20, generator=None)
        second = model.rollout(actor, first.end, horizon=20, generator=None)
    out = dataclasses.replace(second, reward=torch.cat([first.reward, second.reward]),
                              margin=torch.cat([first.margin, second.margin]),
                              states=torch.cat([first.states, second.states[1:]]))
    obs = env._observe()["policy"]  # the reset's observation again (noise-free: the same)
    env.reset(seed=3)
    alive = torch.ones(64, dtype=torch.bool)
    for t in range(40):
        torch.testing.assert_close(obs[alive], actor.seen[t][alive], rtol=0, atol=0)
        torch.testing.assert_close(env.sim.x[alive], out.states[t][alive], rtol=0, atol=0)
        with torch.no_grad():
            obs_d, reward, terminated, truncated, _ = env.step(actor.actor(obs))
        obs = obs_d["policy"]
        torch.testing.assert_close(reward[alive], out.reward[t][alive], rtol=0, atol=0)
        torch.testing.assert_close(terminated[alive], out.margin[t][alive] < 0)
        alive &= ~(terminated | truncated)
    assert 0 < int(alive.sum()) < 64  # some flew on, the others crashed (compared up to their crash)


def test_autograd_through_a_rollout_is_the_finite_difference_gradient():
    env = embodied.make_env("quadrotor-hover", num_envs=8, kernel="torch", init_guidance=0.0, **NOISELESS)
    model = HoverModel(env)
    starts = Flight(*(t.double() if t.is_floating_point() else t for t in model.starts(seed=1).parts()))
    actor = actor_for(env, seed=1, dtype=torch.float64)
    bias = actor[2].bias

    def total():
        return model.rollout(actor, starts, horizon=25, generator=None).reward.sum()

    total().backward()
    grad = bias.grad.clone()
    eps = 1e-6
    for i in range(4):
        with torch.no_grad():
            bias[i] += eps
            up = total().item()
            bias[i] -= 2 * eps
            down = total().item()
            bias[i] += eps
        assert abs((up - down) / (2 * eps) - grad[i].item()) <= 1e-5 * max(1.0, abs(grad[i].item()))
    assert grad.abs().min() > 0


def test_flights_pick_rows_and_drop_their_graph():
    env = embodied.make_env("quadrotor-hover", num_envs=4, kernel="torch")
    model = HoverModel(env)
    a, b = model.starts(seed=1), model.starts(seed=2)
    a.x.requires_grad_(True)
    mixed = a.where(torch.tensor([True, False, True, False]), b)
    assert torch.equal(mixed.x[0], b.x[0]) and torch.equal(mixed.x[1], a.x[1]) and torch.equal(mixed.p[2], b.p[2])
    assert torch.equal(mixed.steps, torch.zeros(4, dtype=torch.long)) and mixed.x.requires_grad
    assert not mixed.detach().x.requires_grad
