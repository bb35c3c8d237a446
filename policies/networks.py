"""Networks: MLPs and a batched ensemble MLP (twin critics in one matmul per layer)."""

from __future__ import annotations

import copy
import itertools
import math

import torch
import torch.nn.functional as F
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
        w, b = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
        if w.shape[-1] == 1:  # a critic's value head: the same memory read as [E, 1, in] transposed, which CPU BLAS
            w = w.view(w.shape[0], 1, -1).transpose(1, 2)  # multiplies ~3x faster than a one-column matrix
        return torch.baddbmm(b, x, w)  # detach: gradient flows to the input only (the actor's action through a critic)


class EnsembleMLP(nn.Module):
    """``num`` MLPs of the same shape evaluated together. Input ``[B, in]`` (shared) or ``[E, B, in]``."""

    def __init__(self, num: int, in_dim: int, hidden: list[int], out_dim: int, act: str, layer_norm: bool = False):
        super().__init__()
        self.num, self.layer_norm = num, layer_norm
        dims = [in_dim, *hidden, out_dim]
        self.layers = nn.ModuleList(EnsembleLinear(num, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = activation(act)()

    def forward(self, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``layer_norm``: each hidden layer's pre-activation normalized over its units (no affine: the next layer
        scales), as RLPD's and FastTD3's critics, which bounds Q's growth off the data at high update ratios."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num, -1, -1)
        for i, layer in enumerate(self.layers):
            x = layer(x, detach)
            if i < len(self.layers) - 1:
                if self.layer_norm:
                    x = F.layer_norm(x, x.shape[-1:])
                x = self.act(x)
        return x


class GroupMLP(nn.Module):
    """An MLP that is exactly equivariant under a finite symmetry group at the cost of a plain MLP
    of the same width (a group-convolutional network on the regular representation, Cohen & Welling
    2016): hidden width ``w`` holds ``w / G`` channels per group element.

        h1[g]  = act(W1 (g x) + b1)                       lifting: one shared layer per group image
        h+1[g] = act(sum_g' W[g' o g^-1] h[g'] + b)       group layers: weights shared along the group
        y      = mean_g g^-1 (W_out h_L[g] + b_out)       projection back to the output representation

    ``group`` acts on the input (key ``in_key``) and the output (key ``out_key``) by signed
    permutations. ``[B, in] -> [B, out]``."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int, act: str, group, in_key: str = "policy",
                 out_key: str = "action", out_gain: float = 1.0):
        super().__init__()
        n = group.size
        if any(w % n for w in hidden):
            raise UserError(f"hidden widths {hidden} must be multiples of the symmetry group's size {n}")
        channels = [w // n for w in hidden]
        self.register_buffer("in_index", group.index[in_key], persistent=False)  # [G, in]
        self.register_buffer("in_sign", group.sign[in_key], persistent=False)
        self.register_buffer("in_inv_index", group.inv_index[in_key], persistent=False)
        self.register_buffer("in_inv_sign", group.inv_sign[in_key], persistent=False)
        self.register_buffer("out_inv_index", group.inv_index[out_key], persistent=False)  # [G, out]
        self.register_buffer("out_inv_sign", group.inv_sign[out_key], persistent=False)
        # kernel[g, g'] = element g' o g^-1: which shared weight connects input copy g' to output copy g
        kernel = [[group.compose(gp, group.inverse(g)) for gp in range(n)] for g in range(n)]
        self.register_buffer("kernel", torch.tensor(kernel), persistent=False)
        self.lift = nn.Linear(in_dim, channels[0])
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(channels[:-1], channels[1:]):
            bound = 1.0 / math.sqrt(n * a)  # nn.Linear's default init for the full [n a] fan-in
            self.weights.append(nn.Parameter(torch.empty(n, b, a).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(b).uniform_(-bound, bound)))
        self.out = nn.Linear(channels[-1], out_dim)
        nn.init.orthogonal_(self.out.weight, gain=out_gain)
        nn.init.zeros_(self.out.bias)
        self.act = activation(act)()
        self.num = n
        index, sign, self._gather_sizes, self._gather_shapes = self._gather_map()
        self.register_buffer("gather_index", index, persistent=False)  # see _assemble
        self.register_buffer("gather_sign", sign, persistent=False)

    def orbit(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in] -> [B * G, in]``: every group image of every row."""
        return (x[:, self.in_index] * self.in_sign).reshape(-1, x.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Each layer is one matmul on the activations: the group structure goes into the weights,
        which are assembled from the shared parameters (one gather): on every call that records gradients, and
        otherwise once per change of the parameters (a target network, acting), which their version counters
        tell: a writer that bypasses them (torch's fused Adam kernel) must bump them
        (``embodied.algos.optim.FusedAdam`` does)."""
        if torch.is_grad_enabled():
            layers = self._assemble()
        else:
            key = tuple((q.data_ptr(), q._version) for q in self.parameters())
            if getattr(self, "_cache_key", None) != key:
                self._cache, self._cache_key = self._assemble(), key
            layers = self._cache
        h = x
        for i, (bias, weight_t) in enumerate(layers):
            h = torch.addmm(bias, h, weight_t)
            if i < len(layers) - 1:
                h = self.act(h)
        return h

    def _assemble(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(bias, weight^T)`` of every layer of the equivalent plain MLP: every entry but the projection's bias is
        one signed parameter, so all of them are one gather from the concatenated parameters (three ops where the
        layer-by-layer assembly, ``_assemble_reference``, takes ~25: torch's per-op cost dominates at these sizes,
        and the weights are assembled on every actor step, target step and act). Equal to the reference exactly."""
        shapes = self._gather_shapes
        flat = torch.cat([q.reshape(-1) for q in self.parameters()])
        parts = (flat.index_select(0, self.gather_index) * self.gather_sign).split(self._gather_sizes)
        layers = [(parts[i], parts[i + 1].view(shapes[i + 1]).t()) for i in range(0, len(parts) - 2, 2)]
        return [*layers, (parts[-1].view(shapes[-1]).mean(0), parts[-2].view(shapes[-2]).t())]

    @torch.no_grad()
    def _gather_map(self) -> tuple[torch.Tensor, torch.Tensor, list[int], list[tuple[int, ...]]]:
        """Where each assembled entry comes from: ``assembled = cat(parameters)[index] * sign``, read off the
        reference assembly run on probe parameters (their flat positions + 1, then all ones for the signs); the
        entries come as [bias, weight [out, in]] per layer, then the projection's weight [out, G c] and its bias's
        signed group images [G, out]. Returns index, sign, and the size and shape of each piece. Built once, with
        the module."""
        twin = copy.deepcopy(self).double()  # probes in float64 (exact positions), on a copy: no parameter is written
        params = list(twin.parameters())
        total = sum(q.numel() for q in params)
        start = 0
        for q in params:
            q.copy_(torch.arange(start + 1, start + q.numel() + 1, dtype=q.dtype, device=q.device).view_as(q))
            start += q.numel()
        probe = twin._assemble_reference()
        for q in params:
            q.fill_(1.0)
        unit = twin._assemble_reference()
        entries, signs, shapes = [], [], []

        def add(value: torch.Tensor, s: torch.Tensor) -> None:
            entries.append((value / s).reshape(-1))
            signs.append(s.reshape(-1))
            shapes.append(tuple(value.shape))

        for (b, w_t), (b1, w1_t) in zip(probe[:-1], unit[:-1]):
            add(b, b1)
            add(w_t.t(), w1_t.t())
        add(probe[-1][1].t(), unit[-1][1].t())
        # the projection's bias is a mean over the group of signed entries: gathered as [G, out], averaged after
        offsets = dict(zip(map(id, params), itertools.accumulate((q.numel() for q in params), initial=0)))
        position = offsets[id(twin.out.bias)] + 1 + twin.out_inv_index.double()  # [G, out]
        add(position * twin.out_inv_sign.double(), twin.out_inv_sign.double())
        index = torch.cat(entries).round().long() - 1
        if int(index.min()) < 0 or int(index.max()) >= total:
            raise RuntimeError("GroupMLP: the gather map could not be read off the reference assembly")
        sign = torch.cat(signs).to(self.lift.weight.dtype)
        return index, sign, [math.prod(s) for s in shapes], shapes

    def _assemble_reference(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(bias, weight^T)`` of every layer, assembled layer by layer (the definition ``_assemble`` is read off)."""
        n = self.num
        # lifting: W1 (g x) = (W1 P_g) x with (W1 P_g)[:, i] = sign_g^-1[i] W1[:, index_g^-1[i]]
        c, d = self.lift.weight.shape
        lift = self.lift.weight.index_select(1, self.in_inv_index.flatten()).view(c, n, d) * self.in_inv_sign
        layers = [(self.lift.bias.repeat(n), lift.transpose(0, 1).reshape(n * c, d).t())]
        for w, bias in zip(self.weights, self.biases):
            c_out, c_in = w.shape[1], w.shape[2]
            full = w.index_select(0, self.kernel.flatten()).view(n, n, c_out, c_in)
            full = full.permute(0, 2, 1, 3).reshape(n * c_out, n * c_in)  # [G c_out, G c_in]
            layers.append((bias.repeat(n), full.t()))
        # projection: mean_g g^-1 (W_out h[g] + b_out) as one [G c, out] matrix
        a = self.out.weight.shape[0]
        flat = self.out_inv_index.flatten()
        out_w = self.out.weight.index_select(0, flat).view(n, a, -1) * self.out_inv_sign[..., None]  # [G, out, c]
        out_b = (self.out.bias.index_select(0, flat).view(n, a) * self.out_inv_sign).mean(0)
        # [G c, out] as the transpose of a contiguous [out, G c]: CPU BLAS multiplies a narrow right-hand matrix ~3x
        # faster in that layout (nn.Linear's own)
        layers.append((out_b, (out_w.transpose(0, 1).reshape(a, -1) / n).t()))
        return layers


class ImageEncoder(nn.Module):
    """A small CNN for one image term (several cameras stacked as channels): conv 8x8 stride 4 (16), 4x4 stride 2
    (32), 3x3 stride 1 (32), each with ReLU, then a linear layer to ``features`` with ReLU (the Nature-DQN stack
    at half width, sized for 64-px images on a CPU). Input: the flat channel-major image ``[B, C*H*W]``."""

    LAYERS = ((16, 8, 4), (32, 4, 2), (32, 3, 1))  # (channels, kernel, stride)

    def __init__(self, shape: tuple[int, int, int], features: int = 128):
        super().__init__()
        c, h, w = (int(v) for v in shape)
        self.shape = (c, h, w)
        convs = []
        for out, k, s in self.LAYERS:
            if h < k or w < k:
                raise UserError(f"image {shape} is too small for the CNN encoder (needs >= 36x36)")
            convs.append(nn.Conv2d(c, out, k, s))
            c, h, w = out, (h - k) // s + 1, (w - k) // s + 1
        self.convs = nn.ModuleList(convs)
        self.fc = nn.Linear(c * h * w, features)
        self.out_dim = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.shape)
        for conv in self.convs:
            x = torch.relu(conv(x))
        return torch.relu(self.fc(x.flatten(1)))
