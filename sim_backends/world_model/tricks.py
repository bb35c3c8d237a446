"""The DreamerV3 tricks (reference subsystems.md 2.2; Hafner et al. 2023, arXiv:2301.04104), as small pure
functions with exact-value tests: symlog / symexp squashing, two-hot targets over symlog bins, the 1% uniform
mix of categorical latents, and the KL of categorical latents with free bits and dyn/rep balancing."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) ln(|x| + 1)``: squashes large magnitudes, identity-like near 0."""
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) (e^|x| - 1)``, the inverse of ``symlog``."""
    return torch.sign(x) * torch.expm1(x.abs())


class TwoHot:
    """Two-hot targets over ``bins`` points ``linspace(low, high, bins)`` in symlog space (DreamerV3: 255 bins
    on [-20, 20]). A target ``y`` puts weight on the two bins around ``s = symlog(y)``:
    ``w_k = (b_{k+1} - s) / (b_{k+1} - b_k)``, ``w_{k+1} = 1 - w_k``; the prediction is
    ``symexp(sum softmax(logits) b)``."""

    def __init__(self, low: float = -20.0, high: float = 20.0, bins: int = 255, device=None):
        if bins < 2 or not high > low:
            raise ValueError(f"two-hot needs bins >= 2 and high > low, got {bins}, [{low}, {high}]")
        self.bins = torch.linspace(low, high, bins, device=device)

    def encode(self, y: torch.Tensor) -> torch.Tensor:
        """``y [...] -> [..., bins]``, rows summing to 1 (targets beyond the range go to the end bin)."""
        b = self.bins.to(y.device)
        s = symlog(y).clamp(b[0], b[-1])
        k = (torch.bucketize(s, b, right=True) - 1).clamp(0, b.numel() - 2)
        lo, hi = b[k], b[k + 1]
        w_hi = (s - lo) / (hi - lo)
        out = torch.zeros(*y.shape, b.numel(), device=y.device, dtype=y.dtype)
        out.scatter_(-1, k.unsqueeze(-1), (1 - w_hi).unsqueeze(-1))
        out.scatter_add_(-1, (k + 1).unsqueeze(-1), w_hi.unsqueeze(-1))
        return out

    def decode(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., bins] -> [...]``: the expected bin in symlog space, mapped back with symexp."""
        return symexp((logits.softmax(-1) * self.bins.to(logits.device)).sum(-1))

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the logits against the two-hot target, ``[...]``."""
        return -(self.encode(y) * logits.log_softmax(-1)).sum(-1)


def unimix(logits: torch.Tensor, mix: float = 0.01) -> torch.Tensor:
    """Log-probabilities of ``(1 - mix) softmax(logits) + mix / K`` over the last dimension (DreamerV3's 1%
    unimix: no class ever has probability 0, so KL terms stay finite)."""
    k = logits.shape[-1]
    return torch.log((1 - mix) * logits.softmax(-1) + mix / k)


def categorical_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` of independent categoricals ``[..., groups, classes]`` (log-probabilities), summed over
    groups and classes: ``[...]``."""
    return (logp.exp() * (logp - logq)).sum((-1, -2))


def kl_loss(post_logp: torch.Tensor, prior_logp: torch.Tensor, free_nats: float = 1.0, dyn: float = 0.5,
            rep: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DreamerV3's KL balancing with free bits, per sample:

        L = dyn max(free, KL[sg(q) || p]) + rep max(free, KL[q || sg(p)])

    The dynamics term trains the prior toward the posterior, the representation term (smaller) the posterior
    toward the prior. Returns ``(loss [...], dyn_kl [...], rep_kl [...])``; the KL values before clipping."""
    dyn_kl = categorical_kl(post_logp.detach(), prior_logp)
    rep_kl = categorical_kl(post_logp, prior_logp.detach())
    loss = dyn * dyn_kl.clamp_min(free_nats) + rep * rep_kl.clamp_min(free_nats)
    return loss, dyn_kl, rep_kl


def straight_through_sample(logp: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One-hot samples of categoricals ``[..., classes]`` with straight-through gradients:
    ``onehot + p - sg(p)``."""
    probs = logp.exp()
    flat = probs.reshape(-1, probs.shape[-1])
    idx = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    onehot = F.one_hot(idx, probs.shape[-1]).to(probs.dtype).reshape(probs.shape)
    return onehot + probs - probs.detach()
