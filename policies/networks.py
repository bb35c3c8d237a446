"""Networks: MLPs and a batched ensemble MLP (twin critics in one matmul per layer)."""

from __future__ import annotations

import math

import torch
from torch import nn

from embodied.core.errors import UserError

ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU}


def activation(name: str) -> type[nn.Module]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise UserError(f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}") from None


def mlp(in_dim: int, hidden: list[int], out_dim: int, act: str, out_gain: float = 1.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), activation(act)()]
    last = nn.Linear(dims[-1], out_dim)
    nn.init.orthogonal_(last.weight, gain=out_gain)
    nn.init.zeros_(last.bias)
    layers.append(last)
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """``num`` independent linear layers applied as one batched matmul: ``[E, B, in] -> [E, B, out]``."""

    def __init__(self, num: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default init, per member
        self.weight = nn.Parameter(torch.empty(num, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
        if detach:  # gradient flows to the input only (e.g. the actor's action through a critic)
            return torch.baddbmm(self.bias.detach(), x, self.weight.detach())
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleMLP(nn.Module):
    """``num`` MLPs of the same shape evaluated together. Input ``[B, in]`` (shared) or ``[E, B, in]``."""

    def __init__(self, num: int, in_dim: int, hidden: list[int], out_dim: int, act: str):
        super().__init__()
        self.num = num
        dims = [in_dim, *hidden, out_dim]
        self.layers = nn.ModuleList(EnsembleLinear(num, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = activation(act)()

    def forward(self, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num, -1, -1)
        for i, layer in enumerate(self.layers):
            x = layer(x, detach)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x
