"""TD3's gradient step on the numba kernel (``embodied/kernels/td3_numba.py``): what it supports, and the flat
buffers it writes. The torch step (``TD3._gradient_step``) is the reference and the fallback.

The kernel works on flat float32 vectors; the learner's torch parameters, target networks and Adam moments
are pointed at views of them once, at build, so everything that reads the torch modules (acting, evaluation,
checkpoints, export, ``load_state_dict``'s in-place copies) sees the kernel's writes, and the kernel sees
theirs. Its random numbers come from a splitmix64 state of its own, checkpointed with the learner."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.autograd.graph import increment_version

from embodied.core.errors import UserError
from embodied.kernels import td3_numba as K
from embodied.kernels.background import Background
from embodied.policies.networks import GroupMLP

KERNELS = ("auto", "numba", "torch")


def unsupported(algo) -> str | None:
    """Why the kernel cannot run this learner's step (None: it can)."""
    if algo.device.type != "cpu":
        return "it runs on CPU learners only"
    if algo.policy_cfg.activation not in ("relu", "tanh"):
        return f"activation {algo.policy_cfg.activation!r} (it has relu and tanh)"
    if not (isinstance(algo.pi.normalizer, nn.Identity) and isinstance(algo.q.normalizer, nn.Identity)):
        return "observation normalization"
    if not (isinstance(algo.pi.net, GroupMLP) or _plain_layers(algo.pi.net) is not None):
        return "this actor network"
    return None


def _plain_layers(net: nn.Module) -> list[nn.Linear] | None:
    """The linear layers of an ``mlp`` (Linear, activation, ..., Linear), or None for anything else."""
    if not isinstance(net, nn.Sequential):
        return None
    linears = [m for m in net if isinstance(m, nn.Linear)]
    others = [m for m in net if not isinstance(m, nn.Linear)]
    if len(linears) != len(others) + 1 or any(not isinstance(m, (nn.ReLU, nn.Tanh)) for m in others):
        return None
    return linears


def _flatten_list(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat tensor holding ``tensors``' values, and a view of it shaped as each."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).contiguous()
    views, start = [], 0
    for t in tensors:
        views.append(flat[start:start + t.numel()].view_as(t))
        start += t.numel()
    return flat, views


def _flatten(params: list[nn.Parameter]) -> torch.Tensor:
    """One flat tensor holding ``params``, which become views of it (values kept)."""
    flat, views = _flatten_list(params)
    for p, view in zip(params, views):
        p.data = view
    return flat


def _critic_layout(net) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The twin critic's flat layout (``W_l [2, in, out]``, ``b_l [2, 1, out]`` in parameter order): each layer's
    weight and bias offsets and the widths from input to output."""
    dims, w_off, b_off, start = [], [], [], 0
    for layer in net.layers:
        w_off.append(start)
        start += layer.weight.numel()
        b_off.append(start)
        start += layer.bias.numel()
        dims.append(layer.weight.shape[1])
    dims.append(net.layers[-1].weight.shape[2])
    return np.array(w_off, dtype=np.int64), np.array(b_off, dtype=np.int64), np.array(dims, dtype=np.int64)


def _actor_layout(net: nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(index, sign, dims, G)``: the actor as ``assembled = flat[index] * sign`` (td3_numba's layout)."""
    if isinstance(net, GroupMLP):
        dims = [net.lift.in_features, *(net.lift.out_features * net.num for _ in range(len(net.weights) + 1)),
                net.out.out_features]
        return (net.gather_index.numpy().astype(np.int64), net.gather_sign.numpy().astype(np.float32),
                np.array(dims, dtype=np.int64), net.num)
    linears = _plain_layers(net)
    offsets, start = {}, 0
    for p in net.parameters():
        offsets[id(p)] = start
        start += p.numel()
    index = []
    for lin in linears[:-1]:
        index += [offsets[id(lin.bias)] + np.arange(lin.bias.numel()), offsets[id(lin.weight)] + np.arange(
            lin.weight.numel())]
    last = linears[-1]
    index += [offsets[id(last.weight)] + np.arange(last.weight.numel()), offsets[id(last.bias)] + np.arange(
        last.bias.numel())]
    index = np.concatenate(index).astype(np.int64)
    dims = [linears[0].in_features, *(lin.out_features for lin in linears)]
    return index, np.ones(index.shape[0], dtype=np.float32), np.array(dims, dtype=np.int64), 1


def characters(net: nn.Module) -> tuple[np.ndarray, np.ndarray]:
    """``(chi, chi_w)``: the real (+-1) characters of the group a ``GroupMLP``'s hidden layers convolve over, by
    element (``chi[k, g]``) and by the element in a hidden weight's block (0, g') (``chi_w[k, g']``), when there are
    as many as the group has elements (an abelian group of involutions, e.g. the quadrotor's mirror group Z2 x Z2:
    its hidden layers are then diagonal in that basis); ``[[1]]`` and ``[[1]]`` (dense layers) otherwise."""
    dense = np.ones((1, 1), dtype=np.float32), np.ones((1, 1), dtype=np.float32)
    if not isinstance(net, GroupMLP) or len(net.weights) == 0:
        return dense
    kernel = net.kernel.numpy()  # kernel[g, g'] = g' o g^-1
    n = kernel.shape[0]
    if n > 8:
        return dense
    chars = []
    for bits in range(2 ** n):
        chi = np.array([-1.0 if bits >> g & 1 else 1.0 for g in range(n)])
        # a homomorphism to {+-1} is its own inverse: chi(g' o g^-1) = chi(g') chi(g)
        if all(chi[kernel[g, gp]] == chi[gp] * chi[g] for g in range(n) for gp in range(n)):
            chars.append(chi)
    if len(chars) != n:
        return dense
    chi = np.array(chars, dtype=np.float32)
    return chi, np.ascontiguousarray(chi[:, kernel[0]])


class FusedStep:
    """The kernel's view of one TD3 learner (built once, after the learner's networks and optimizer)."""

    def __init__(self, algo, seed: int):
        import numba
        import scipy.linalg.cython_blas  # noqa: F401  (loads the BLAS that numba's matmuls call, so it can be sized)
        from threadpoolctl import threadpool_limits

        # the step runs on ``kernel_threads`` threads (default: as many as torch's ops may use, torch_threads), each
        # on its slice of the batch with a one-thread BLAS: OpenBLAS would otherwise start threads of its own for
        # every matmul
        threads = algo.cfg.kernel_threads or torch.get_num_threads()
        if threads < 1:
            raise UserError(f"td3.kernel_threads must be >= 1, got {threads}")
        # at most the process's numba threads (an ensemble member's process holds one); the slices are spread over
        # them by the kernel's parallel loop
        self.parts = min(threads, numba.get_num_threads())
        threadpool_limits(1, user_api="blas")
        self.algo = algo
        if len(algo.opt.groups) != 2:
            raise UserError("td3.kernel=numba updates a critic and an actor group only")
        q_params, pi_params = algo.opt.groups[0]["params"], algo.opt.groups[1]["params"]
        self.flat = {
            "qf": _flatten(q_params), "qt": _flatten(algo._qt_params),
            "pf": _flatten(pi_params), "pt": _flatten(algo._pit_params),
        }
        opt = algo.opt
        for i, (m, v) in enumerate((("qm", "qv"), ("pm", "pv"))):
            self.flat[m], opt.exp_avg[i] = _flatten_list(opt.exp_avg[i])
            self.flat[v], opt.exp_avg_sq[i] = _flatten_list(opt.exp_avg_sq[i])
            self.flat["q_steps" if i == 0 else "pi_steps"], opt.steps[i] = _flatten_list(opt.steps[i])
        self.q_w, self.q_b, self.q_dims = _critic_layout(algo.q.net)
        self.p_index, self.p_sign, self.p_dims, self.p_groups = _actor_layout(algo.pi.net)
        self.chi, self.chi_w = characters(algo.pi.net)
        sl = algo.buffer.slices
        self.cols = np.array([sl[k].start for k in ("obs", "cobs", "action", "reward", "discount", "next_obs",
                                                    "next_cobs")], dtype=np.int64)
        self.dims3 = np.array(algo._head_dims, dtype=np.int64)
        cfg = algo.cfg
        self.hp = np.array([cfg.target_noise, cfg.target_noise_clip, cfg.lr_critic, cfg.lr_actor,
                            opt.groups[0]["weight_decay"], opt.groups[1]["weight_decay"], *opt.betas, opt.eps,
                            -1.0 if cfg.max_grad_norm is None else cfg.max_grad_norm, cfg.tau], dtype=np.float64)
        self.ln = bool(algo.policy_cfg.critic_layer_norm)
        self.kind = K.RELU if algo.policy_cfg.activation == "relu" else K.TANH
        self.rng = np.array([(seed * 0x9E3779B97F4A7C15 + 0x5DEECE66D) % 2**64], dtype=np.uint64)
        b, a = cfg.batch_size, algo.act_dim
        self.idx, self.g = np.empty(b, dtype=np.int64), np.empty(b, dtype=np.int64)
        self.eps = np.empty((b, a), dtype=np.float32)
        self.metrics = np.zeros(3, dtype=np.float32)
        self._aug: tuple[np.ndarray, np.ndarray] | None = None
        self.q_params, self.pi_params = q_params, pi_params
        self._act_key: tuple | None = None
        self._act_asm: np.ndarray | None = None
        # the step's compile (~37 s of CPU when numba's cache is cold) in a child, beside the env's in this process
        self._background: Background | None = Background([(K.td3_update, self._update_args(True, True))])

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's action (``pi.act``) computed by the kernel: its weights assembled again only after they
        changed (their version counters), ~15 us against ~90 us for ``GroupMLP``'s torch assembly, which every
        exploration step paid after every actor update."""
        key = tuple(p._version for p in self.pi_params)
        if key != self._act_key:
            self._act_asm = K.assemble(self.flat["pf"].numpy(), self.p_index, self.p_sign)
            self._act_key = key
        x = np.ascontiguousarray(obs.numpy(), dtype=np.float32)
        return torch.from_numpy(K.actor_act(self._act_asm, self.p_dims, self.p_groups, self.chi, self.chi_w, x,
                                            self.kind))

    def draw(self) -> None:
        algo = self.algo
        groups = algo.symmetry.size if algo.cfg.symmetry_augmentation else 1
        K.td3_draw(self.rng, algo.buffer.size, self.idx.shape[0], groups, algo.act_dim, self.idx, self.g, self.eps)

    def augmentation(self) -> tuple[np.ndarray, np.ndarray]:
        if self._aug is None:
            if self.algo.cfg.symmetry_augmentation:
                index, sign = self.algo._buffer_row_symmetry()
                self._aug = (index.numpy().astype(np.int64), sign.numpy().astype(np.float32))
            else:
                self._aug = (np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1), dtype=np.float32))
        return self._aug

    def _update_args(self, actor_step: bool, delayed: bool) -> tuple:
        algo = self.algo
        # numpy views taken afresh: a storage may have moved since (sending a tensor through a torch
        # multiprocessing pipe moves its storage to shared memory in place, which an older view would outlive)
        f = {k: t.numpy() for k, t in self.flat.items()}
        aug_index, aug_sign = self.augmentation()
        return (algo.buffer.storage.numpy(), self.cols, self.dims3, aug_index, aug_sign, self.idx, self.g,
                self.eps, f["qf"], f["qt"], f["qm"], f["qv"], f["q_steps"], self.q_w, self.q_b, self.q_dims,
                f["pf"], f["pt"], f["pm"], f["pv"], f["pi_steps"], self.p_index, self.p_sign, self.p_dims,
                self.p_groups, self.chi, self.chi_w, self.hp, self.ln, self.kind, actor_step, delayed, self.parts,
                self.metrics)

    def step(self, actor_step: bool, delayed: bool) -> dict[str, torch.Tensor]:
        """The gradient step on the rows drawn last (``draw``)."""
        algo = self.algo
        if self._background is not None:  # a cold cache: the step compiled in a child since __init__
            self._background.wait()
            self._background = None
        self.hp[K.LR_Q], self.hp[K.LR_PI] = algo.opt.groups[0]["lr"], algo.opt.groups[1]["lr"]  # a schedule's
        K.td3_update(*self._update_args(actor_step, delayed))
        # the writes bypassed the parameters' version counters: bumped, as FusedAdam does, so what is keyed on
        # them (GroupMLP's assembled weights for acting and for the target actor) sees the change
        increment_version(self.q_params)
        if actor_step:
            increment_version(self.pi_params)
        if delayed:
            increment_version(algo._qt_params)
            increment_version(algo._pit_params)
        m = torch.from_numpy(self.metrics.copy())
        out = {"td3/critic_loss": m[0], "td3/q_mean": m[1]}
        if actor_step:
            out["td3/actor_loss"] = m[2]
        return out
