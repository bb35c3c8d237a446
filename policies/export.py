"""A policy's deterministic action path as a flat program of a few layer types, the one description
export reads: ONNX is written from its folded form (plain matmuls), the C emitter from its compact
form (an equivariant layer's free parameters stored once and expanded in the loops).

Ops, applied in order to a vector ``x``:
    normalize      y = clip((x - mean) / std, -clip, clip)
    dense          y = W x + b                                   W [out, in]
    relu | tanh | elu (alpha 1)
    group_lift     y[g c + j] = b[j] + sum_i W[j, i] s[g, i] x[p[g, i]]       the GroupMLP lifting layer
                   (W [c, in]; p, s: the group acting on the input, (g x)[i] = s[g, i] x[p[g, i]], so that
                   y[g] = W (g x) + b)
    group_dense    y[g c + o] = b[o] + sum_g' sum_i w[k[g, g'], o, i] x[g' c_in + i]      w [G, c_out, c_in]
    group_project  y[a] = 1/G sum_g s[g, a] (W x[g] + b)[p[g, a]]           the projection to the action
    slice          y = x[start:stop]
    clip           y = clip(x, lo, hi)
    image_features y = [relu(fc(flatten(relu(conv_2(relu(conv_1(relu(conv_0(img)))))))), x[:start], x[stop:]]
                   img = x[start:stop] as (C, H, W); conv_l: W{l} [out, in, k, k], b{l}, stride s{l}, no padding
                   (the CNN encoder of an image term, ``ImageSplit``)
    save           y = x, and x kept as saved[k] (k counts the saves)   a composite policy (a residual over a base)
    concat_saved   y = [saved[index], x]                                  (size: saved[index]'s length)
    load_saved     y = saved[index]                                       (size: its length)
    residual_add   y = clip(saved[index] + clip(scale x, -limit, limit), -1, 1) (scale, limit: a number or per entry)
    add_saved      y = saved[index] + x                                   (a flow head's Euler step)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from embodied.core.errors import UserError
from embodied.policies.actor_critic import (
    POLICIES,
    DeterministicActor,
    GaussianActor,
    ImageSplit,
    SquashedGaussianActor,
)
from embodied.policies.chunked import ChunkedActor, ChunkQueue
from embodied.policies.ensemble import EnsembleActor
from embodied.policies.flow import FlowChunkActor, time_embedding
from embodied.policies.networks import GroupMLP
from embodied.policies.normalizer import EmpiricalNormalizer
from embodied.policies.residual import ResidualActor
from embodied.policies.sampled import SampledActor

ACTIVATION_OPS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.ELU: "elu"}


@dataclass
class Op:
    kind: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, float | int] = field(default_factory=dict)

    def out_dim(self, in_dim: int) -> int:
        a = self.arrays
        if self.kind in ("dense", "group_project"):
            return a["W"].shape[0]
        if self.kind == "group_lift":
            return a["p"].shape[0] * a["W"].shape[0]
        if self.kind == "group_dense":
            return a["k"].shape[0] * a["w"].shape[1]
        if self.kind == "slice":
            return int(self.attrs["stop"]) - int(self.attrs["start"])
        if self.kind == "image_features":
            return a["fcW"].shape[0] + in_dim - (int(self.attrs["stop"]) - int(self.attrs["start"]))
        if self.kind == "concat_saved":
            return int(self.attrs["size"]) + in_dim
        if self.kind == "load_saved":
            return int(self.attrs["size"])
        return in_dim


def _np(t: torch.Tensor, dtype=np.float32) -> np.ndarray:
    return t.detach().cpu().numpy().astype(dtype)


def _activation(module: nn.Module) -> Op:
    for cls, kind in ACTIVATION_OPS.items():
        if isinstance(module, cls):
            if kind == "elu" and module.alpha != 1.0:
                raise UserError(f"export supports ELU with alpha 1, got {module.alpha}")
            return Op(kind)
    raise UserError(f"export has no op for {type(module).__name__}")


def _net_ops(net: nn.Module) -> list[Op]:
    if isinstance(net, GroupMLP):
        act = _activation(net.act)
        ops = [Op("group_lift", {"W": _np(net.lift.weight), "b": _np(net.lift.bias),
                                 "p": _np(net.in_index, np.int64), "s": _np(net.in_sign)}), act]
        for w, b in zip(net.weights, net.biases):
            ops += [Op("group_dense", {"w": _np(w), "b": _np(b), "k": _np(net.kernel, np.int64)}), act]
        ops.append(Op("group_project", {"W": _np(net.out.weight), "b": _np(net.out.bias),
                                        "p": _np(net.out_inv_index, np.int64), "s": _np(net.out_inv_sign)}))
        return ops
    if isinstance(net, nn.Sequential):
        ops = []
        for m in net:
            if isinstance(m, nn.Linear):
                ops.append(Op("dense", {"W": _np(m.weight), "b": _np(m.bias)}))
            else:
                ops.append(_activation(m))
        return ops
    raise UserError(f"export has no program for a {type(net).__name__} network")


def program(actor: nn.Module) -> tuple[list[Op], int]:
    """The actor's deterministic ``act`` path as ops, and its input size."""
    if isinstance(actor, ProgramPolicy):
        return list(actor.ops), int(actor.init_kwargs["obs_dim"])
    if isinstance(actor, SampledActor):
        raise UserError("a policy that samples (filtered-bc.sampled_policy) exports from a language-conditioned "
                        "(VLA) run only, whose ONNX takes its noise as an input; the op programs and the C have none")
    if isinstance(actor, EnsembleActor):
        return ensemble_program(actor)
    if isinstance(actor, ResidualActor):  # obs -> save -> base -> save -> [obs, b] -> residual -> b + residual
        _plain_input(actor)
        if chunk_spec(actor.base) is not None:
            raise UserError("a residual over an action-chunked base is two programs (the base's chunk queue sits "
                            "between the networks): program(actor.base) and residual_program(actor)")
        base, obs_dim = program(actor.base)
        residual, _ = program(actor.residual)
        return [Op("save"), *base, Op("save"), Op("concat_saved", attrs={"index": 0, "size": obs_dim}), *residual,
                _residual_add(actor)], obs_dim
    ops: list[Op] = []
    norm = actor.normalizer
    if isinstance(norm, EmpiricalNormalizer):
        ops.append(Op("normalize", {"mean": _np(norm.mean), "std": _np(torch.sqrt(norm.var + norm.eps))},
                      {"clip": float(norm.clip)}))
    if isinstance(actor, FlowChunkActor):
        return ops + _flow_ops(actor), int(actor.init_kwargs["obs_dim"])
    trunk = getattr(actor, "trunk", nn.Identity())
    if isinstance(trunk, ImageSplit):
        enc = trunk.encoder
        arrays = {"fcW": _np(enc.fc.weight), "fcb": _np(enc.fc.bias)}
        attrs = {"start": trunk.start, "stop": trunk.stop, "C": enc.shape[0], "H": enc.shape[1], "W": enc.shape[2],
                 "convs": len(enc.convs)}
        for i, conv in enumerate(enc.convs):
            arrays[f"W{i}"], arrays[f"b{i}"], attrs[f"s{i}"] = _np(conv.weight), _np(conv.bias), conv.stride[0]
        ops.append(Op("image_features", arrays, attrs))
    elif not isinstance(trunk, nn.Identity):
        raise UserError(f"export has no op for a {type(trunk).__name__} trunk")
    ops += _net_ops(actor.net)
    if isinstance(actor, (DeterministicActor, ChunkedActor)):  # a chunked actor's program outputs its whole chunk
        ops.append(Op("tanh"))
    elif isinstance(actor, SquashedGaussianActor):
        ops += [Op("slice", attrs={"start": 0, "stop": actor.act_dim}), Op("tanh")]
    elif isinstance(actor, GaussianActor):
        ops.append(Op("clip", attrs={"lo": -1.0, "hi": 1.0}))
    else:
        raise UserError(f"export has no program for a {type(actor).__name__}")
    return ops, int(actor.init_kwargs["obs_dim"])


def ensemble_program(actor: EnsembleActor) -> tuple[list[Op], int]:
    """The members' action mean: ``obs -> save`` (saved[0]), the first member's program ``-> save`` (saved[1]); member
    ``k`` from ``load_saved 0``, its program, ``add_saved k - 1`` (the running sum) ``-> save``; a last ``dense``
    ``I / K`` divides the sum. Members are plain programs (no saves of their own, no chunk queue)."""
    ops: list[Op] = [Op("save")]
    obs_dim = act_dim = None
    for k, member in enumerate(actor.members):
        if chunk_spec(member) is not None:
            raise UserError("export has no program for an ensemble of action-chunked members")
        member_ops, in_dim = program(member)
        if any(op.kind in ("save", "load_saved", "concat_saved", "add_saved") for op in member_ops):
            raise UserError(f"export has no program for an ensemble of composite members ({type(member).__name__})")
        if obs_dim is not None and in_dim != obs_dim:
            raise UserError(f"ensemble members read {obs_dim} and {in_dim} observation entries")
        obs_dim = in_dim
        if k:
            ops += [Op("load_saved", attrs={"index": 0, "size": in_dim}), *member_ops,
                    Op("add_saved", attrs={"index": k})]
        else:
            ops += member_ops
        if k < len(actor.members) - 1:
            ops.append(Op("save"))
        width = in_dim
        for op in member_ops:
            width = op.out_dim(width)
        act_dim = width
    eye = np.eye(act_dim, dtype=np.float32) / len(actor.members)
    return [*ops, Op("dense", {"W": eye, "b": np.zeros(act_dim, np.float32)})], obs_dim


def _plain_input(actor: ResidualActor) -> None:
    if actor.reads != "obs":
        raise UserError(f"export has no program for a residual that reads its base's {actor.reads} view")


def _residual_add(actor: ResidualActor) -> Op:
    return Op("residual_add", attrs={"index": 1, "scale": actor.scale, "limit": actor.limit})


def residual_program(actor: ResidualActor) -> tuple[list[Op], int]:
    """The second of a residual's two programs where its base is action-chunked (the base's own program gives the
    chunk and a runner's queue picks the action ``b``): ``[obs, b] -> clip(b + clip(scale r, -limit, limit), -1,
    1)`` with ``r`` the residual on ``[obs, b]``, and its input size (``obs_dim + act_dim``)."""
    _plain_input(actor)
    residual, in_dim = program(actor.residual)
    act_dim = int(actor.residual.init_kwargs["act_dim"])
    obs_dim = in_dim - act_dim
    return [Op("save"), Op("slice", attrs={"start": obs_dim, "stop": in_dim}), Op("save"),
            Op("load_saved", attrs={"index": 0, "size": in_dim}), *residual, _residual_add(actor)], in_dim


def _flow_ops(actor: FlowChunkActor) -> list[Op]:
    """A flow head's Euler steps unrolled (``FlowChunkActor.integrate`` from ``x_0 = 0``): the normalized observation
    is saved; at step k the first layer reads ``[o, x_k]`` with ``t_k``'s embedding folded into its bias (``x_0 = 0``:
    step 0 reads ``o`` alone), the last layer is scaled by ``dt``, and ``add_saved`` adds ``x_k``."""
    layers = list(actor.net)
    first, rest = layers[0], _net_ops(nn.Sequential(*layers[1:]))
    d, n = actor.obs_dim, actor.horizon * actor.act_dim
    W, b = first.weight.detach(), first.bias.detach()
    dt = 1.0 / actor.steps
    ops = [Op("save")]  # saved[0] = o; saved[k] = x_k
    for k in range(actor.steps):
        bias = _np(b + W[:, d + n:] @ time_embedding(torch.tensor([k * dt], dtype=W.dtype))[0])
        if k:
            ops.append(Op("concat_saved", attrs={"index": 0, "size": d}))
        ops.append(Op("dense", {"W": _np(W[:, :d + n] if k else W[:, :d]), "b": bias}))
        last = rest[-1].arrays
        ops += rest[:-1] + [Op("dense", {"W": last["W"] * np.float32(dt), "b": last["b"] * np.float32(dt)})]
        if k:
            ops.append(Op("add_saved", attrs={"index": k}))
        if k < actor.steps - 1:
            ops.append(Op("save"))
    return ops + [Op("clip", attrs={"lo": -1.0, "hi": 1.0})]


def chunk_spec(actor: nn.Module) -> dict | None:
    """``{"horizon": H, "execute": k}`` of an action-chunked actor, whose program outputs the whole chunk
    (``H * act_dim`` entries, action after action) and whose runner executes ``k`` of them before it looks again;
    None for a per-step actor."""
    if isinstance(actor, ChunkQueue) and int(actor.horizon) > 1:
        ensemble = {} if actor.ensemble is None else {"ensemble": float(actor.ensemble)}
        return {"horizon": int(actor.horizon), "execute": int(actor.execute), **ensemble}
    return None


def residual_op(ops: list[Op]) -> Op | None:
    """The ``residual_add`` op of a residual over a base (its ``index`` names the base's saved action), or None."""
    return next((op for op in ops if op.kind == "residual_add"), None)


def fold(ops: list[Op]) -> list[Op]:
    """The same program with every group op as the dense matrix its shared weights make."""
    out = []
    for op in ops:
        a = op.arrays
        if op.kind == "group_lift":
            W, p, s = a["W"], a["p"], a["s"]  # y[g c + j] = sum_i W[j, i] s[g, i] x[p[g, i]]
            G, (c, d) = p.shape[0], W.shape
            full = np.zeros((G, c, d), np.float32)
            for g in range(G):  # p[g] is a permutation: column p[g, i] of image g is s[g, i] W[:, i]
                full[g][:, p[g]] = W * s[g]
            out.append(Op("dense", {"W": full.reshape(G * c, d), "b": np.tile(a["b"], G)}))
        elif op.kind == "group_dense":
            w, k = a["w"], a["k"]
            G, co, ci = w.shape
            full = w[k.reshape(-1)].reshape(G, G, co, ci).transpose(0, 2, 1, 3).reshape(G * co, G * ci)
            out.append(Op("dense", {"W": np.ascontiguousarray(full), "b": np.tile(a["b"], G)}))
        elif op.kind == "group_project":
            W, b, p, s = a["W"], a["b"], a["p"], a["s"]  # y[a] = 1/G sum_g s[g,a] (W h[g] + b)[p[g,a]]
            G = p.shape[0]
            full = np.concatenate([W[p[g]] * s[g][:, None] for g in range(G)], axis=1) / G  # [A, G c]
            bias = np.mean([b[p[g]] * s[g] for g in range(G)], axis=0)
            out.append(Op("dense", {"W": full.astype(np.float32), "b": bias.astype(np.float32)}))
        else:
            out.append(op)
    return out


class ProgramModule(nn.Module):
    """A folded program as a torch module of standard ops (what ``torch.onnx.export`` writes)."""

    def __init__(self, ops: list[Op]):
        super().__init__()
        self.ops = ops
        self.steps: list[tuple[str, str | None]] = []
        for i, op in enumerate(ops):
            name = f"op{i}"
            if op.kind.startswith("group_"):
                raise ValueError("fold() the program first")
            if op.kind == "dense":
                layer = nn.Linear(op.arrays["W"].shape[1], op.arrays["W"].shape[0])
                layer.weight.data.copy_(torch.from_numpy(op.arrays["W"]))
                layer.bias.data.copy_(torch.from_numpy(op.arrays["b"]))
                self.add_module(name, layer)
            elif op.kind == "normalize":
                self.register_buffer(f"{name}_mean", torch.from_numpy(op.arrays["mean"]))
                self.register_buffer(f"{name}_std", torch.from_numpy(op.arrays["std"]))
            elif op.kind == "image_features":
                for k, v in op.arrays.items():
                    self.register_buffer(f"{name}_{k}", torch.from_numpy(v))
            elif op.kind == "residual_add":  # a number or one per entry: buffers follow the module's device
                for k in ("scale", "limit"):
                    self.register_buffer(f"{name}_{k}", torch.tensor(op.attrs[k], dtype=torch.float32))
            self.steps.append((op.kind, name))
        self.attrs = [dict(op.attrs) for op in ops]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        saved: list[torch.Tensor] = []
        for (kind, name), attrs in zip(self.steps, self.attrs):
            if kind == "save":
                saved.append(x)
            elif kind == "concat_saved":
                x = torch.cat([saved[int(attrs["index"])], x], -1)
            elif kind == "load_saved":
                x = saved[int(attrs["index"])]
            elif kind == "add_saved":
                x = saved[int(attrs["index"])] + x
            elif kind == "residual_add":
                scale, lim = getattr(self, f"{name}_scale"), getattr(self, f"{name}_limit")
                x = (saved[int(attrs["index"])] + torch.clamp(scale * x, -lim, lim)).clamp(-1.0, 1.0)
            elif kind == "dense":
                x = getattr(self, name)(x)
            elif kind == "normalize":
                c = attrs["clip"]
                x = ((x - getattr(self, f"{name}_mean")) / getattr(self, f"{name}_std")).clamp(-c, c)
            elif kind == "relu":
                x = torch.relu(x)
            elif kind == "tanh":
                x = torch.tanh(x)
            elif kind == "elu":
                x = nn.functional.elu(x)
            elif kind == "slice":
                x = x[..., int(attrs["start"]):int(attrs["stop"])]
            elif kind == "clip":
                x = x.clamp(attrs["lo"], attrs["hi"])
            elif kind == "image_features":
                a = {k: getattr(self, f"{name}_{k}") for k in ("fcW", "fcb")}
                s0, s1 = int(attrs["start"]), int(attrs["stop"])
                h = x[:, s0:s1].reshape(x.shape[0], int(attrs["C"]), int(attrs["H"]), int(attrs["W"]))
                for i in range(int(attrs["convs"])):
                    h = torch.relu(nn.functional.conv2d(h, getattr(self, f"{name}_W{i}"),
                                                        getattr(self, f"{name}_b{i}"), int(attrs[f"s{i}"])))
                h = torch.relu(h.flatten(1) @ a["fcW"].T + a["fcb"])
                x = torch.cat([h, x[:, :s0], x[:, s1:]], 1)
            else:
                raise ValueError(f"unknown op {kind!r}")
        return x


class ProgramPolicy(ProgramModule):
    """A policy given only as its program (a deploy bundle's ONNX read back): ``act`` is the program; the
    ``ops`` and ``obs_dim`` rebuild it (``policy_spec``), and export writes the program as it is."""

    spec_name = "program"

    def __init__(self, ops: list, obs_dim: int, act_dim: int):
        ops = [op if isinstance(op, Op) else Op(**op) for op in ops]
        super().__init__(ops)
        self.init_kwargs = dict(ops=[{"kind": op.kind, "arrays": op.arrays, "attrs": op.attrs} for op in ops],
                                obs_dim=int(obs_dim), act_dim=int(act_dim))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


class ChunkedProgramPolicy(ChunkQueue, ProgramPolicy):
    """A chunked policy given only as its program (a chunked bundle read back): the program gives the chunk,
    ``act`` executes it from per-env queues like ``ChunkedActor``."""

    spec_name = "chunked_program"

    def __init__(self, ops: list, obs_dim: int, act_dim: int, horizon: int, execute: int,
                 ensemble: float | None = None):
        super().__init__(ops, obs_dim, act_dim)
        self._set_chunking(act_dim, horizon, execute, ensemble)
        self.init_kwargs.update(horizon=int(horizon), execute=int(execute), ensemble=ensemble)

    def chunk(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).reshape(-1, self.horizon, self.act_dim)


POLICIES.register("program", ProgramPolicy)
POLICIES.register("chunked_program", ChunkedProgramPolicy)


def run_numpy(ops: list[Op], x: np.ndarray) -> np.ndarray:
    """Reference interpreter of a program (compact or folded) on ``[B, in]`` float64, for tests."""
    x = np.asarray(x, np.float64)
    saved: list[np.ndarray] = []
    for op in ops:
        a, k = op.arrays, op.kind
        if k == "save":
            saved.append(x)
        elif k == "concat_saved":
            x = np.concatenate([saved[int(op.attrs["index"])], x], 1)
        elif k == "load_saved":
            x = saved[int(op.attrs["index"])]
        elif k == "add_saved":
            x = saved[int(op.attrs["index"])] + x
        elif k == "residual_add":
            scale, lim = np.asarray(op.attrs["scale"], np.float64), np.asarray(op.attrs["limit"], np.float64)
            x = np.clip(saved[int(op.attrs["index"])] + np.clip(scale * x, -lim, lim), -1.0, 1.0)
        elif k == "normalize":
            x = np.clip((x - a["mean"]) / a["std"], -op.attrs["clip"], op.attrs["clip"])
        elif k == "dense":
            x = x @ a["W"].T.astype(np.float64) + a["b"]
        elif k == "relu":
            x = np.maximum(x, 0.0)
        elif k == "tanh":
            x = np.tanh(x)
        elif k == "elu":
            x = np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))
        elif k == "slice":
            x = x[:, int(op.attrs["start"]):int(op.attrs["stop"])]
        elif k == "clip":
            x = np.clip(x, op.attrs["lo"], op.attrs["hi"])
        elif k == "image_features":
            t = op.attrs
            s0, s1 = int(t["start"]), int(t["stop"])
            h = x[:, s0:s1].reshape(x.shape[0], int(t["C"]), int(t["H"]), int(t["W"]))
            for i in range(int(t["convs"])):
                h = np.maximum(_conv2d(h, a[f"W{i}"].astype(np.float64), a[f"b{i}"], int(t[f"s{i}"])), 0.0)
            h = np.maximum(h.reshape(h.shape[0], -1) @ a["fcW"].T.astype(np.float64) + a["fcb"], 0.0)
            x = np.concatenate([h, x[:, :s0], x[:, s1:]], 1)
        elif k == "group_lift":
            G = a["p"].shape[0]
            x = np.concatenate([(x[:, a["p"][g]] * a["s"][g]) @ a["W"].T.astype(np.float64) + a["b"]
                                for g in range(G)], axis=1)
        elif k == "group_dense":
            w, kk = a["w"].astype(np.float64), a["k"]
            G, co, ci = w.shape
            h = x.reshape(-1, G, ci)
            x = np.concatenate([sum(h[:, gp] @ w[kk[g, gp]].T for gp in range(G)) + a["b"] for g in range(G)], 1)
        elif k == "group_project":
            G, c = a["p"].shape[0], a["W"].shape[1]
            h = x.reshape(-1, G, c)
            z = [h[:, g] @ a["W"].T.astype(np.float64) + a["b"] for g in range(G)]
            x = sum(z[g][:, a["p"][g]] * a["s"][g] for g in range(G)) / G
        else:
            raise ValueError(f"unknown op {k!r}")
    return x


def _conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """``[B, C, H, W]`` * ``[O, C, k, k]``, no padding: the plain sum over the window (reference for tests)."""
    k = w.shape[2]
    ho, wo = (x.shape[2] - k) // stride + 1, (x.shape[3] - k) // stride + 1
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride][:, :, :ho, :wo]
    return np.einsum("bchwij,ocij->bohw", win, w) + b[None, :, None, None]
