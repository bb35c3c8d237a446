"""Running observation normalizer that lives inside the policy module (exported with it)."""

from __future__ import annotations

import torch
from torch import nn


class EmpiricalNormalizer(nn.Module):
    """y = clip((x - mean) / sqrt(var + eps), +-clip). Statistics merge batches exactly with
    Chan et al.'s parallel update: for batch mean m_b, var v_b (population), count n_b:
        delta = m_b - m;  m' = m + delta n_b / n';  M2' = v n + v_b n_b + delta^2 n n_b / n'."""

    def __init__(self, dim: int, eps: float = 1e-8, clip: float = 10.0, passthrough: tuple[int, int] | None = None):
        super().__init__()
        self.eps, self.clip = eps, clip
        # entries [start, stop) pass through unchanged (mean 0, var 1 - eps): an image the policy encodes itself
        self.passthrough = tuple(passthrough) if passthrough else None
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # a frozen normalizer keeps its statistics: a fine-tuned policy (init=RUN) sees its inputs scaled as the
        # policy it starts from was trained with (new rollouts would shift them under it)
        self.frozen = False
        self._pin()

    @torch.no_grad()
    def _pin(self) -> None:
        if self.passthrough:
            a, b = self.passthrough
            self.mean[a:b] = 0.0
            self.var[a:b] = 1.0 - self.eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """``x: [B, dim]``."""
        n_b = x.shape[0]
        if n_b == 0 or self.frozen:
            return
        m_b = x.mean(0)
        v_b = x.var(0, unbiased=False)
        n = float(self.count)
        total = n + n_b
        delta = m_b - self.mean
        self.mean += delta * (n_b / total)
        self.var.copy_((self.var * n + v_b * n_b + delta * delta * (n * n_b / total)) / total)
        self.count += n_b
        self._pin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)
