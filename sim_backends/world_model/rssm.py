"""A recurrent state-space model with the DreamerV3 tricks (Hafner et al. 2023; reference subsystems.md 2.2), for
image and vector observations.

State: a deterministic ``h [deter]`` and a stochastic ``z``, ``stoch`` categoricals of ``classes`` classes
(one-hot, straight-through, 1% unimix). ``h_t = GRU(h_{t-1}, in(z_{t-1}, a_{t-1}))``; the prior ``p(z_t | h_t)``
and the posterior ``q(z_t | h_t, embed(x_t))``. Heads on the features ``(h, z)``: a decoder (images: a transposed
CNN ending in a sigmoid, MSE; vectors: an MLP predicting ``symlog(x)``, MSE), the reward as two-hot over 255 symlog
bins (last layer zero-initialized), and the continuation flag (Bernoulli). The loss is
``recon + reward + cont + dyn max(1, KL[sg(q) || p]) + rep max(1, KL[q || sg(p)])``.

Deviation: the recurrent core is ``nn.GRUCell`` (DreamerV3 uses a block-diagonal GRU with normalized inputs);
inputs are LayerNorm + SiLU as in DreamerV3. Sizes: ``PRESETS`` (``size1m``, ``size12m`` from its configs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from embodied.sim_backends.world_model.tricks import TwoHot, kl_loss, straight_through_sample, symlog, unimix


@dataclass
class RSSMConfig:
    deter: int = 512  # size1m
    hidden: int = 64
    stoch: int = 32
    classes: int = 4
    units: int = 64
    depth: int = 16  # channels of the first conv layer; doubled at every stride-2 layer
    unimix: float = 0.01
    free_nats: float = 1.0
    dyn_scale: float = 0.5
    rep_scale: float = 0.1
    lr: float = 3e-4
    batch_size: int = 16
    length: int = 32  # [steps] training sequences


PRESETS = {"size1m": {"deter": 512, "hidden": 64, "classes": 4, "units": 64},
           "size12m": {"deter": 2048, "hidden": 256, "classes": 16, "units": 256}}


def _mlp(fan_in: int, units: int, out: int, layers: int = 1) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(fan_in, units), nn.LayerNorm(units), nn.SiLU()]
        fan_in = units
    return nn.Sequential(*mods, nn.Linear(fan_in, out))


class ImageEncoder(nn.Module):
    """``[B, C, H, W]`` in [0, 1] (H, W multiples of 16) -> ``[B, embed]``: four stride-2 convs."""

    def __init__(self, shape: tuple[int, int, int], depth: int):
        super().__init__()
        c, h, w = shape
        chans = [c, depth, 2 * depth, 4 * depth, 8 * depth]
        self.net = nn.Sequential(*[m for a, b in zip(chans[:-1], chans[1:])
                                   for m in (nn.Conv2d(a, b, 4, 2, 1), nn.GroupNorm(1, b), nn.SiLU())], nn.Flatten())
        self.out_dim = 8 * depth * (h // 16) * (w // 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x - 0.5)


class ImageDecoder(nn.Module):
    def __init__(self, feat: int, shape: tuple[int, int, int], depth: int):
        super().__init__()
        c, h, w = shape
        self.start = (8 * depth, h // 16, w // 16)
        self.fc = nn.Linear(feat, math.prod(self.start))
        chans = [8 * depth, 4 * depth, 2 * depth, depth]
        layers: list[nn.Module] = []
        for a, b in zip(chans[:-1], chans[1:]):
            layers += [nn.ConvTranspose2d(a, b, 4, 2, 1), nn.GroupNorm(1, b), nn.SiLU()]
        self.net = nn.Sequential(*layers, nn.ConvTranspose2d(depth, c, 4, 2, 1))

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(self.fc(feat).reshape(-1, *self.start)))


class RSSM(nn.Module):
    """Observations are flat ``[..., obs_dim]``: an image ``(C, H, W)`` first (channel-major, in [0, 1]) where
    ``image`` is given, then ``vector`` other entries."""

    def __init__(self, act_dim: int, cfg: RSSMConfig, image: tuple[int, int, int] | None = None, vector: int = 0):
        super().__init__()
        if image is None and vector < 1:
            raise ValueError("an RSSM needs an image or a vector observation")
        if image is not None and (image[1] % 16 or image[2] % 16):
            raise ValueError(f"image height and width must be multiples of 16, got {image}")
        self.cfg, self.act_dim, self.image, self.vector = cfg, act_dim, image, vector
        self.image_dim = math.prod(image) if image else 0
        embed = 0
        if image:
            self.img_enc = ImageEncoder(image, cfg.depth)
            embed += self.img_enc.out_dim
        if vector:
            self.vec_enc = _mlp(vector, cfg.units, cfg.units, 2)
            embed += cfg.units
        z = cfg.stoch * cfg.classes
        self.feat_dim = cfg.deter + z
        self.inp = nn.Sequential(nn.Linear(z + act_dim, cfg.hidden), nn.LayerNorm(cfg.hidden), nn.SiLU())
        self.gru = nn.GRUCell(cfg.hidden, cfg.deter)
        self.prior_net = _mlp(cfg.deter, cfg.hidden, z)
        self.post_net = _mlp(cfg.deter + embed, cfg.hidden, z)
        if image:
            self.img_dec = ImageDecoder(self.feat_dim, image, cfg.depth)
        if vector:
            self.vec_dec = _mlp(self.feat_dim, cfg.units, vector, 2)
        self.twohot = TwoHot()
        self.reward_head = _mlp(self.feat_dim, cfg.units, self.twohot.bins.numel(), 1)
        nn.init.zeros_(self.reward_head[-1].weight)  # DreamerV3: outscale 0 for the reward and value heads
        nn.init.zeros_(self.reward_head[-1].bias)
        self.cont_head = _mlp(self.feat_dim, cfg.units, 1, 1)

    # ---- pieces ----------------------------------------------------------------------------------------
    def initial(self, batch: int, device=None) -> dict[str, torch.Tensor]:
        device = device or next(self.parameters()).device
        return {"deter": torch.zeros(batch, self.cfg.deter, device=device),
                "stoch": torch.zeros(batch, self.cfg.stoch * self.cfg.classes, device=device)}

    def embed(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, obs_dim] -> [B, embed]``."""
        parts = []
        if self.image:
            parts.append(self.img_enc(obs[:, : self.image_dim].reshape(-1, *self.image)))
        if self.vector:
            parts.append(self.vec_enc(symlog(obs[:, self.image_dim:])))
        return torch.cat(parts, 1)

    def _logp(self, logits: torch.Tensor) -> torch.Tensor:
        return unimix(logits.reshape(*logits.shape[:-1], self.cfg.stoch, self.cfg.classes), self.cfg.unimix)

    def img_step(self, state: dict, action: torch.Tensor, generator=None,
                 sample: bool = True) -> tuple[dict, torch.Tensor]:
        """The prior step: ``h' = GRU(h, in(z, a))``, ``z' ~ p(z | h')`` (the mode without ``sample``). Actions
        are squashed by ``a / max(1, |a|)``."""
        a = action / action.abs().clamp_min(1.0).detach()
        deter = self.gru(self.inp(torch.cat([state["stoch"], a], -1)), state["deter"])
        logp = self._logp(self.prior_net(deter))
        z = straight_through_sample(logp, generator) if sample else F.one_hot(logp.argmax(-1), self.cfg.classes).float()
        return {"deter": deter, "stoch": z.flatten(-2)}, logp

    def obs_step(self, state: dict, action: torch.Tensor, embed: torch.Tensor, first: torch.Tensor,
                 generator=None) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """One posterior step; ``first [B]`` resets the state (and the action) at an episode start."""
        keep = (~first).float()[:, None]
        state = {k: v * keep for k, v in state.items()}
        prior, prior_logp = self.img_step(state, action * keep, generator)
        post_logp = self._logp(self.post_net(torch.cat([prior["deter"], embed], -1)))
        z = straight_through_sample(post_logp, generator)
        return {"deter": prior["deter"], "stoch": z.flatten(-2)}, post_logp, prior_logp

    @staticmethod
    def feat(state: dict) -> torch.Tensor:
        return torch.cat([state["deter"], state["stoch"]], -1)

    def decode(self, feat: torch.Tensor) -> torch.Tensor:
        """Features ``[B, feat] -> `` flat observations ``[B, obs_dim]`` (images in [0, 1], vectors in raw units)."""
        parts = []
        if self.image:
            parts.append(self.img_dec(feat).flatten(1))
        if self.vector:
            parts.append(torch.sign(v := self.vec_dec(feat)) * torch.expm1(v.abs()))
        return torch.cat(parts, 1)

    def reward(self, feat: torch.Tensor) -> torch.Tensor:
        return self.twohot.decode(self.reward_head(feat))

    # ---- training ---------------------------------------------------------------------------------------
    def loss(self, obs: torch.Tensor, prev_action: torch.Tensor, reward: torch.Tensor, cont: torch.Tensor,
             first: torch.Tensor, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        """Sequences ``[B, T, ...]`` in DreamerV3's alignment: ``obs_t``, the action that led to it
        (``prev_action_t``), the reward received with it, ``cont_t = 1 - terminal_t``, ``first_t``."""
        b, t = obs.shape[:2]
        embed = self.embed(obs.flatten(0, 1)).reshape(b, t, -1)
        state = self.initial(b, obs.device)
        feats, posts, priors = [], [], []
        for i in range(t):
            state, post_logp, prior_logp = self.obs_step(state, prev_action[:, i], embed[:, i], first[:, i], generator)
            feats.append(self.feat(state))
            posts.append(post_logp)
            priors.append(prior_logp)
        feat = torch.stack(feats, 1).flatten(0, 1)
        kl, dyn, rep = kl_loss(torch.stack(posts, 1), torch.stack(priors, 1), self.cfg.free_nats, self.cfg.dyn_scale,
                               self.cfg.rep_scale)
        flat = obs.flatten(0, 1)
        recon = torch.zeros(b * t, device=obs.device)
        if self.image:
            recon = recon + ((self.img_dec(feat).flatten(1) - flat[:, : self.image_dim]) ** 2).sum(1)
        if self.vector:
            recon = recon + ((self.vec_dec(feat) - symlog(flat[:, self.image_dim:])) ** 2).sum(1)
        rew = self.twohot.loss(self.reward_head(feat), reward.flatten())
        con = F.binary_cross_entropy_with_logits(self.cont_head(feat).squeeze(-1), cont.flatten(), reduction="none")
        total = (recon + rew + con).mean() + kl.mean()
        parts = {"recon": recon, "reward": rew, "cont": con, "kl_dyn": dyn, "kl_rep": rep}
        return total, {f"rssm/{k}": float(v.detach().mean()) for k, v in parts.items()}
