"""OpenVLA's action tokenizer (``prismatic/vla/action_tokenizer.py``), as per-dimension bins for a small model: each
action dimension is normalized with the dataset's 1st and 99th percentiles to [-1, 1] (clipped), then cut into
``bins`` uniform bins over [-1, 1]; a bin decodes to its centre. The quantization error is at most half a bin
(``(q99 - q01) / bins`` in action units) inside the percentile range.

OpenVLA digitizes against 256 bin *edges* and decodes to 255 centres (its last token is never produced); here the
256 bins have 257 edges, so every token decodes to the middle of its own bin."""

from __future__ import annotations

import torch


def normalize(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Percentile normalization to [-1, 1] (clipped)."""
    return (2.0 * (action - low) / (high - low) - 1.0).clamp(-1.0, 1.0)


def bin_position(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor, bins: int) -> torch.Tensor:
    """Where ``action`` lies on the bin axis, continuously: bin ``k``'s centre is at ``k``."""
    return (normalize(action, low, high) + 1.0) * 0.5 * bins - 0.5


def encode_bins(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor, bins: int) -> torch.Tensor:
    """Tokens (long, ``0 .. bins - 1``) of actions ``[..., act_dim]``."""
    return ((normalize(action, low, high) + 1.0) * 0.5 * bins).floor().clamp(0, bins - 1).long()


def decode_bins(tokens: torch.Tensor, low: torch.Tensor, high: torch.Tensor, bins: int) -> torch.Tensor:
    """Tokens -> actions: each bin's centre, un-normalized (torch ops that export to ONNX)."""
    x = (tokens.to(low.dtype) + 0.5) * (2.0 / bins) - 1.0
    return 0.5 * (x + 1.0) * (high - low) + low


class ActionTokenizer:
    def __init__(self, low: torch.Tensor, high: torch.Tensor, bins: int = 256):
        low, high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
        if low.shape != high.shape or low.dim() != 1:
            raise ValueError(f"low and high must be [act_dim], got {tuple(low.shape)} and {tuple(high.shape)}")
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        # a dimension the data never moves keeps a unit range (it decodes to its constant)
        span = high - low
        self.low = torch.where(span > 1e-8, low, low - 0.5)
        self.high = torch.where(span > 1e-8, high, high + 0.5)
        self.bins = int(bins)

    @classmethod
    def fit(cls, actions: torch.Tensor, bins: int = 256, quantile: float = 0.01) -> ActionTokenizer:
        """Percentile normalization from a dataset's actions ``[..., act_dim]``."""
        flat = actions.reshape(-1, actions.shape[-1]).float()
        q = torch.quantile(flat, torch.tensor([quantile, 1.0 - quantile]), dim=0)
        return cls(q[0], q[1], bins)

    def normalize(self, action: torch.Tensor) -> torch.Tensor:
        return normalize(action, self.low.to(action.device), self.high.to(action.device))

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        low, high = self.low.to(x.device), self.high.to(x.device)
        return 0.5 * (x + 1.0) * (high - low) + low

    def encode(self, action: torch.Tensor) -> torch.Tensor:
        """Tokens (long, in ``0 .. bins - 1``) of actions ``[..., act_dim]``."""
        return encode_bins(action, self.low.to(action.device), self.high.to(action.device), self.bins)

    def centers(self) -> torch.Tensor:
        """``[bins]``: each bin's centre in [-1, 1]."""
        return (torch.arange(self.bins, dtype=torch.float32) + 0.5) * (2.0 / self.bins) - 1.0

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        return decode_bins(tokens, self.low.to(tokens.device), self.high.to(tokens.device), self.bins)

    def state_dict(self) -> dict:
        return {"low": self.low.tolist(), "high": self.high.tolist(), "bins": self.bins}

    @classmethod
    def from_state(cls, state: dict) -> ActionTokenizer:
        return cls(torch.tensor(state["low"]), torch.tensor(state["high"]), int(state["bins"]))
