"""A policy that acts by sampling: ``act(obs)`` draws its action from the actor's own distribution at a
``temperature`` (``tempered``), with a generator of its own, where a deterministic policy takes the mean.

Why: success-filtered cloning (``algo=filtered-bc``) fits the policy to the actions its rollouts *sampled* at a
temperature, so what its updates raise is the success of that sampling policy, not of its mean. The mean can come
to rest where the sampled policy does not: mini-libero's clones freeze at the expert's switch points (action ~0 at a
fixed point of the closed loop) and a little noise walks them off. ``act(obs) = mean + stddev * noise``, the noise
standard normal: from the generator (reseeded by ``reset(None)``, so that an evaluation is reproducible), or given
(``forward(obs, noise)``: what the exported graph takes as its ``noise`` input). Gaussian policies only (a VLA's
continuous head, a Gaussian actor, an ensemble of them); a token head samples bins, which this does not."""

from __future__ import annotations

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, build_policy, policy_spec
from embodied.policies.chunked import reset_policy
from embodied.policies.ensemble import EnsembleActor


def tempered(policy: nn.Module, obs: torch.Tensor, temperature: float):
    """``policy``'s distribution at ``temperature``: the VLA's own (bins or Gaussian), else a Gaussian actor's scale
    times it; an ensemble's as one Gaussian, the mean of its members' means (the action its ``act`` takes) and of
    their scales."""
    if isinstance(policy, EnsembleActor):
        dists = [tempered(m, obs, temperature) for m in policy.members]
        return torch.distributions.Normal(torch.stack([d.mean for d in dists]).mean(0),
                                          torch.stack([d.stddev for d in dists]).mean(0))
    if hasattr(policy, "dist_from"):
        return policy.dist(obs, temperature)
    d = policy.dist(obs)
    return torch.distributions.Normal(d.mean, d.stddev * temperature)


class SampledActor(nn.Module):
    spec_name = "sampled"

    def __init__(self, actor, temperature: float, seed: int = 0, obs_dim: int | None = None,
                 act_dim: int | None = None):
        """``actor``: the policy itself (shared, not copied) or its ``policy_spec``. ``obs_dim`` / ``act_dim`` are
        its own (recorded in the spec like every actor's)."""
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"a sampled policy's temperature must be > 0, got {temperature}")
        self.actor = build_policy(actor) if isinstance(actor, dict) else actor
        spec = policy_spec(self.actor)
        self.temperature, self.seed = float(temperature), int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.act_dim = int(spec["kwargs"]["act_dim"])
        self.init_kwargs = dict(actor=spec, temperature=self.temperature, seed=self.seed,
                                obs_dim=spec["kwargs"].get("obs_dim"), act_dim=self.act_dim)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        d = tempered(self.actor, obs, self.temperature)
        if not isinstance(d, torch.distributions.Normal):
            raise TypeError(f"a sampled policy needs a Gaussian one; {type(self.actor).__name__} gives a "
                            f"{type(d).__name__}")
        return d

    def forward(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        d = self.dist(obs)
        if noise is None:
            noise = torch.randn(d.mean.shape, generator=self.generator).to(d.mean.device)
        return d.mean + d.stddev * noise

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        if mask is None:  # every env starts over: so does the noise
            self.generator.manual_seed(self.seed)
        reset_policy(self.actor, mask)


def unwrapped(actor: nn.Module) -> nn.Module:
    """The policy a ``SampledActor`` samples (its weights), else ``actor`` itself."""
    return actor.actor if isinstance(actor, SampledActor) else actor


def unwrapped_checkpoint(spec: dict, state: dict) -> tuple[dict, dict]:
    """A saved policy's ``policy_spec`` and ``state_dict``; a ``SampledActor``'s as those of the policy it samples."""
    if spec["name"] != SampledActor.spec_name:
        return spec, state
    return spec["kwargs"]["actor"], {k[len("actor."):]: v for k, v in state.items() if k.startswith("actor.")}


POLICIES.register("sampled", SampledActor)
