"""Actors and critics. Every actor's deterministic ``act(obs) -> action`` is the exportable path:
observation normalization sits inside the module, so an exported policy needs no side files."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.registry import POLICIES
from embodied.core.symmetry import SymmetryGroup, concat
from embodied.policies.networks import EnsembleMLP, GroupMLP, ImageEncoder, mlp
from embodied.policies.normalizer import EmpiricalNormalizer

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG2 = math.log(2.0)


def _normalizer(dim: int, enabled: bool, image: list | None = None) -> nn.Module:
    passthrough = (image[0], image[0] + image[1] * image[2] * image[3]) if image else None
    return EmpiricalNormalizer(dim, passthrough=passthrough) if enabled else nn.Identity()


class ImageSplit(nn.Module):
    """An observation vector holding one image term: the CNN's features of the image, then the other entries.
    ``image = [start, C, H, W]`` (the layout's image term, ``Layout.images``); ``[B, obs] -> [B, F + rest]``."""

    def __init__(self, obs_dim: int, image: list, features: int = 128):
        super().__init__()
        self.start, shape = int(image[0]), tuple(int(v) for v in image[1:])
        self.stop = self.start + shape[0] * shape[1] * shape[2]
        self.encoder = ImageEncoder(shape, features)
        self.out_dim = features + obs_dim - (self.stop - self.start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.encoder(x[:, self.start:self.stop]), x[:, :self.start], x[:, self.stop:]], 1)


def _trunk(obs_dim: int, image: list | None) -> tuple[nn.Module, int]:
    if not image:
        return nn.Identity(), obs_dim
    split = ImageSplit(obs_dim, image)
    return split, split.out_dim


def _policy_net(obs_dim: int, hidden: list[int], act_dim: int, activation: str, group: list | None,
                gaussian: bool = False) -> nn.Module:
    """A plain MLP, or with ``group`` (``SymmetryGroup.to_spec()``, kept as plain data so the policy
    spec stays plain data) a ``GroupMLP`` exactly equivariant under the task's symmetry group:
    ``net(g obs) = g net(obs)``. With ``gaussian`` the output is ``[mean, log_std]``: the mean
    transforms like the action, the log std like the action's magnitude (permuted, never negated)."""
    out_dim = 2 * act_dim if gaussian else act_dim
    if group is None:
        return mlp(obs_dim, list(hidden), out_dim, activation)
    elements = []
    for e in group:
        idx, sign = e["action"]
        out = concat((idx, sign), ([i + act_dim for i in idx], [abs(x) for x in sign])) if gaussian else (idx, sign)
        elements.append({"policy": e["policy"], "out": out})
    return GroupMLP(obs_dim, list(hidden), out_dim, activation, SymmetryGroup(elements), out_key="out")


def update_normalizer(actor: nn.Module, obs: torch.Tensor) -> None:
    """Feed ``obs`` to the actor's running normalizer, if it has one; an equivariant actor's sees
    every group image, so its statistics stay symmetric and normalizing commutes with the group."""
    if hasattr(actor.normalizer, "update"):
        if hasattr(actor, "normalizer_input"):  # a normalizer over part of the observation (the VLA's state)
            obs = actor.normalizer_input(obs)
        actor.normalizer.update(actor.net.orbit(obs) if isinstance(getattr(actor, "net", None), GroupMLP) else obs)


class GaussianActor(nn.Module):
    """Diagonal Gaussian with a state-independent log std (PPO). ``obs: [B, obs_dim]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], activation: str = "tanh",
                 obs_normalization: bool = True, init_log_std: float = -0.5, image: list | None = None):
        super().__init__()
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, hidden=list(hidden), activation=activation,
                                obs_normalization=obs_normalization, init_log_std=init_log_std, image=image)
        self.normalizer = _normalizer(obs_dim, obs_normalization, image)
        self.trunk, feat = _trunk(obs_dim, image)  # the CNN encoder where the observation holds an image
        self.net = mlp(feat, list(hidden), act_dim, activation, out_gain=0.01)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.trunk(self.normalizer(obs)))

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        mean = self(obs)
        return torch.distributions.Normal(mean, self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp().expand_as(mean))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).clamp(-1.0, 1.0)


class MultiCategorical:
    """Independent categoricals, one per action dimension (``MultiDiscrete(nvec)``); ``log_prob`` and ``entropy``
    are ``[B, D]`` like a diagonal Gaussian's, so a learner sums them over the last axis either way."""

    def __init__(self, logits: list[torch.Tensor]):
        self.dists = [torch.distributions.Categorical(logits=lg) for lg in logits]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        idx = actions.long()
        return torch.stack([d.log_prob(idx[:, i]) for i, d in enumerate(self.dists)], -1)

    def entropy(self) -> torch.Tensor:
        return torch.stack([d.entropy() for d in self.dists], -1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.stack([torch.multinomial(d.probs, 1, generator=generator).squeeze(-1) for d in self.dists],
                           -1).float()

    @property
    def mode(self) -> torch.Tensor:
        return torch.stack([d.logits.argmax(-1) for d in self.dists], -1).float()


class CategoricalActor(nn.Module):
    """Logits for a ``MultiDiscrete(nvec)`` action (PPO): one head per dimension on a shared trunk; ``act`` is the
    most likely index per dimension (as float32, the dtype envs take actions in)."""

    def __init__(self, obs_dim: int, nvec: list[int], hidden: list[int], activation: str = "tanh",
                 obs_normalization: bool = True, image: list | None = None):
        super().__init__()
        self.nvec = [int(n) for n in nvec]
        self.init_kwargs = dict(obs_dim=obs_dim, nvec=self.nvec, hidden=list(hidden), activation=activation,
                                obs_normalization=obs_normalization, image=image)
        self.normalizer = _normalizer(obs_dim, obs_normalization, image)
        self.trunk, feat = _trunk(obs_dim, image)
        self.net = mlp(feat, list(hidden), sum(self.nvec), activation, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.trunk(self.normalizer(obs)))

    def dist(self, obs: torch.Tensor) -> MultiCategorical:
        return MultiCategorical(list(self(obs).split(self.nvec, dim=-1)))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.dist(obs).mode


def sample_action(dist, generator: torch.Generator) -> torch.Tensor:
    """A sample of a PPO actor's distribution (diagonal Gaussian or multi-categorical) from ``generator``."""
    if isinstance(dist, MultiCategorical):
        return dist.sample(generator)
    return dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator, device=dist.mean.device)


class SquashedGaussianActor(nn.Module):
    """tanh-squashed Gaussian with state-dependent std (SAC). Actions in (-1, 1)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], activation: str = "tanh",
                 obs_normalization: bool = False, group: list | None = None):
        super().__init__()
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, hidden=list(hidden), activation=activation,
                                obs_normalization=obs_normalization, group=group)
        self.act_dim = act_dim
        self.normalizer = _normalizer(obs_dim, obs_normalization)
        self.net = _policy_net(obs_dim, hidden, act_dim, activation, group, gaussian=True)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(self.normalizer(obs)).split(self.act_dim, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """Reparameterized sample and its log-probability ``[B]`` under the squashed distribution:
        log pi(a) = log N(u; mu, s) - sum log(1 - tanh(u)^2),
        with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) for numerical stability."""
        mean, log_std = self(obs)
        std = log_std.exp()
        eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + std * eps
        log_prob = (-0.5 * eps * eps - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (2.0 * (LOG2 - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), log_prob

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self(obs)[0])


class DeterministicActor(nn.Module):
    """a = tanh(f(obs)) (TD3). ``forward`` keeps the graph for the actor loss; ``act`` does not.
    With ``group`` the actor is exactly equivariant under the task's symmetry group (for the
    quadrotor: its hover point is the set-point by construction, see ``core/symmetry.py``)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], activation: str = "relu",
                 obs_normalization: bool = False, group: list | None = None):
        super().__init__()
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, hidden=list(hidden), activation=activation,
                                obs_normalization=obs_normalization, group=group)
        self.normalizer = _normalizer(obs_dim, obs_normalization)
        self.net = _policy_net(obs_dim, hidden, act_dim, activation, group)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(self.normalizer(obs)))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


class ValueCritic(nn.Module):
    """V(s) on the critic observation group. ``[B, obs_dim] -> [B]``."""

    def __init__(self, obs_dim: int, hidden: list[int], activation: str = "tanh", obs_normalization: bool = True,
                 image: list | None = None):
        super().__init__()
        self.normalizer = _normalizer(obs_dim, obs_normalization, image)
        self.trunk, feat = _trunk(obs_dim, image)
        self.net = mlp(feat, list(hidden), 1, activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.trunk(self.normalizer(obs))).squeeze(-1)


class TwinQCritic(nn.Module):
    """Two Q(s, a) heads evaluated as one ensemble. ``[B, obs], [B, act] -> [2, B]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], activation: str = "tanh",
                 obs_normalization: bool = False, layer_norm: bool = False):
        super().__init__()
        self.normalizer = _normalizer(obs_dim, obs_normalization)
        self.net = EnsembleMLP(2, obs_dim + act_dim, list(hidden), 1, activation, layer_norm)

    def forward(self, obs: torch.Tensor, action: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``detach``: parameters act as constants (gradient reaches ``action`` only)."""
        return self.net(torch.cat([self.normalizer(obs), action], -1), detach).squeeze(-1)


class DeterministicPolicy(nn.Module):
    """What ``embodied.load_policy`` returns: ``act(obs_policy) -> action`` with no gradient."""

    def __init__(self, actor: nn.Module):
        super().__init__()
        self.actor = actor.eval()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(obs)

    def reset(self, mask: torch.Tensor | None = None) -> None:
        """New episodes in the envs of ``mask`` (all when None): a policy with per-env state (a chunk queue)
        starts it over; any other has nothing to do."""
        from embodied.policies.chunked import reset_policy

        reset_policy(self.actor, mask)


POLICIES.register("gaussian_mlp", GaussianActor)
POLICIES.register("squashed_gaussian_mlp", SquashedGaussianActor)
POLICIES.register("deterministic_mlp", DeterministicActor)
POLICIES.register("categorical_mlp", CategoricalActor)


def policy_spec(actor: nn.Module) -> dict:
    """How to rebuild an actor: registry name and constructor kwargs."""
    names = {GaussianActor: "gaussian_mlp", SquashedGaussianActor: "squashed_gaussian_mlp",
             DeterministicActor: "deterministic_mlp", CategoricalActor: "categorical_mlp"}
    name = getattr(actor, "spec_name", None) or names[type(actor)]  # a composite actor names itself
    return {"name": name, "kwargs": dict(actor.init_kwargs)}


def build_policy(spec: dict) -> nn.Module:
    return POLICIES.get(spec["name"])(**spec["kwargs"])
