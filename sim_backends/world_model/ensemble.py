"""An ensemble of probabilistic MLPs for state tasks (MBPO, Janner et al. 2019; PETS, Chua et al. 2018).

Each member maps ``(state, action)`` to a diagonal Gaussian over ``(next_state - state, reward)`` and a
termination logit. Inputs and targets are standardized with statistics of the data of the latest fit (kept as
buffers, so a saved model is self-contained); log-variances are soft-bounded by learned ``max_logvar`` /
``min_logvar`` (PETS). Members see the same data in their own order; after a fixed epoch budget each keeps the
weights of its best held-out epoch, and the ``elites`` members with the lowest held-out error predict.
Disagreement: the spread of the elites' predicted means, in standardized units (uncertainty of the model
itself, which grows off the data)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from embodied.policies.networks import EnsembleLinear


@dataclass
class EnsembleConfig:
    members: int = 7  # MBPO: 7 networks, 5 elites
    elites: int = 5
    hidden: list[int] = field(default_factory=lambda: [200, 200, 200, 200])
    lr: float = 1e-3
    weight_decay: float = 2.5e-5
    batch_size: int = 256
    holdout: float = 0.1  # fraction of transitions held out to rank members and pick each one's best epoch
    holdout_max: int = 5000  # at most this many held-out transitions
    epochs: int = 5  # epochs of every fit (a fixed budget, MBPO trains to convergence)
    max_updates: int = 2000  # gradient steps of one fit at most, whatever the data size


def _init(layer: EnsembleLinear) -> EnsembleLinear:
    """Truncated normal weights of std ``1 / sqrt(fan_in)`` (LeCun), zero biases. MBPO's ``1 / (2 sqrt(fan_in))``
    halves the signal at every layer: with its 4 hidden layers on our fixed epoch budget the model had not started
    to learn (quadrotor-hover, 30 epochs of 6400 transitions: held-out standardized MSE 0.90 against 0.17)."""
    std = 1.0 / math.sqrt(layer.weight.shape[1])
    with torch.no_grad():
        nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
        layer.bias.zero_()
    return layer


class ProbabilisticEnsemble(nn.Module):
    def __init__(self, state_dim: int, act_dim: int, cfg: EnsembleConfig):
        super().__init__()
        if not 1 <= cfg.elites <= cfg.members:
            raise ValueError(f"elites must be in 1..members ({cfg.members}), got {cfg.elites}")
        self.state_dim, self.act_dim, self.members = state_dim, act_dim, cfg.members
        self.out_dim = state_dim + 1  # delta state, reward
        dims = [state_dim + act_dim, *cfg.hidden]
        self.layers = nn.ModuleList(_init(EnsembleLinear(cfg.members, a, b)) for a, b in zip(dims[:-1], dims[1:]))
        self.head = _init(EnsembleLinear(cfg.members, dims[-1], 2 * self.out_dim + 1))
        self.max_logvar = nn.Parameter(torch.full((self.out_dim,), 0.5))
        self.min_logvar = nn.Parameter(torch.full((self.out_dim,), -10.0))
        self.register_buffer("in_mean", torch.zeros(dims[0]))
        self.register_buffer("in_std", torch.ones(dims[0]))
        self.register_buffer("out_mean", torch.zeros(self.out_dim))
        self.register_buffer("out_std", torch.ones(self.out_dim))
        # 1 for the targets that vary in the data of the latest fit, 0 for those constant in it (a per-episode
        # disturbance, a randomized parameter): those are predicted as their constant exactly, no drift and no noise
        # (quadrotor-hover: the disturbance force's predicted delta was ~1e-3 mg a step at hover, its sampled noise
        # ~8e-3 mg, so an imagined episode's disturbance wandered by ~8% of g over 100 steps)
        self.register_buffer("out_free", torch.ones(self.out_dim))
        self.register_buffer("elite_idx", torch.arange(cfg.elites))

    def forward(self, x: torch.Tensor, member: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [members, B, state+act]`` (raw) -> standardized ``mean, logvar [members, B, out]`` and the
        termination logit ``[members, B]``; with ``member``, ``x [B, state+act]`` through that member alone
        (``[B, out]``, ``[B]``)."""
        def linear(layer: EnsembleLinear, h: torch.Tensor) -> torch.Tensor:
            return layer(h) if member is None else torch.addmm(layer.bias[member, 0], h, layer.weight[member])

        h = (x - self.in_mean) / self.in_std
        for layer in self.layers:
            h = F.silu(linear(layer, h))
        mean, raw, term = linear(self.head, h).split([self.out_dim, self.out_dim, 1], -1)
        logvar = self.max_logvar - F.softplus(self.max_logvar - raw)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar, term.squeeze(-1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a model saved before ``out_free`` existed predicted every target
        state_dict.setdefault(prefix + "out_free", torch.ones_like(self.out_free))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def loss(self, x: torch.Tensor, target: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        """Gaussian NLL of the standardized targets (summed over members, mean over rows and dims), the
        log-variance bound regularizer, and the termination cross-entropy."""
        mean, logvar, term = self(x)
        t = (target - self.out_mean) / self.out_std
        nll = (((mean - t) ** 2) * torch.exp(-logvar) + logvar).mean((1, 2)).sum()
        bound = 0.01 * (self.max_logvar.sum() - self.min_logvar.sum())
        return nll + bound + F.binary_cross_entropy_with_logits(term, terminated, reduction="none").mean(1).sum()

    @torch.no_grad()
    def predict(self, state: torch.Tensor, action: torch.Tensor, generator: torch.Generator | None = None,
                deterministic: bool = False, dims: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """One step for every row of ``state [N, S]``, ``action [N, A]``: a random elite per row draws
        ``next_state [N, S]`` and ``reward [N]`` (its mean with ``deterministic``); ``p_terminal [N]`` is the
        elites' mean termination probability, ``disagreement [N]`` the largest per-dimension std of the elites'
        standardized means (over the state entries ``dims``, or all)."""
        n = state.shape[0]
        x = torch.cat([state, action], 1).expand(self.members, n, -1)
        mean, logvar, term = self(x)
        e = self.elite_idx
        mean, logvar, term = mean[e], logvar[e], term[e]
        pick = torch.randint(e.numel(), (n,), generator=generator, device=state.device)
        rows = torch.arange(n, device=state.device)
        out = mean[pick, rows]
        if not deterministic:
            noise = torch.randn(out.shape, generator=generator, device=state.device)
            out = out + torch.exp(0.5 * logvar[pick, rows]) * noise
        held = mean[..., :self.state_dim] * self.out_free[:self.state_dim]
        spread = held.std(0, unbiased=False) if e.numel() > 1 else held[0] * 0
        if dims is not None:
            spread = spread[:, dims]
        return {**self._step(state, out), "p_terminal": torch.sigmoid(term).mean(0), "disagreement": spread.amax(1)}

    def member_step(self, state: torch.Tensor, action: torch.Tensor, member: int,
                    noise: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """One step of ``state [N, S]``, ``action [N, A]`` through member ``member`` alone, differentiable in both
        (what a learner backpropagates through: dynamics gradients): ``next_state [N, S]``, ``reward [N]`` (the
        member's mean, plus ``exp(logvar / 2) * noise`` with ``noise [N, S + 1]``: a reparameterized sample) and that
        member's ``p_terminal [N]``. With no noise it is ``predict(deterministic=True)`` where that member is picked."""
        mean, logvar, term = self(torch.cat([state, action], 1), member)
        out = mean if noise is None else mean + torch.exp(0.5 * logvar) * noise
        return {**self._step(state, out), "p_terminal": torch.sigmoid(term)}

    @torch.no_grad()
    def expected(self, state: torch.Tensor, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """The elites' mean prediction (no sampling, no member choice): ``next_state [N, S]``, ``reward [N]``,
        ``p_terminal [N]``; what open-loop error reports measure."""
        n = state.shape[0]
        mean, _, term = self(torch.cat([state, action], 1).expand(self.members, n, -1))
        return {**self._step(state, mean[self.elite_idx].mean(0)),
                "p_terminal": torch.sigmoid(term[self.elite_idx]).mean(0)}

    def _step(self, state: torch.Tensor, out: torch.Tensor) -> dict[str, torch.Tensor]:
        """``next_state`` and ``reward`` from a standardized prediction ``out [N, S + 1]`` (entries constant in the
        data held at their constant)."""
        out = out * self.out_std * self.out_free + self.out_mean
        return {"next_state": state + out[:, :self.state_dim], "reward": out[:, self.state_dim]}


_MEMBER_KEYS = ("layers.", "head.")  # per-member weights ([members, ...]); the log-variance bounds are shared


def _standardize_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per column: the mean, the std (1 where the column is constant), and whether it varies (1.0 / 0.0)."""
    std = x.std(0, unbiased=False)
    varies = std >= 1e-6
    return x.mean(0), torch.where(varies, std, torch.ones_like(std)), varies.float()


@torch.no_grad()
def _set_standardization(model: ProbabilisticEnsemble, x: torch.Tensor, y: torch.Tensor) -> None:
    """The model's input and output standardization from the training rows."""
    in_mean, in_std, _ = _standardize_stats(x)
    out_mean, out_std, out_free = _standardize_stats(y)
    for buf, value in ((model.in_mean, in_mean), (model.in_std, in_std), (model.out_mean, out_mean),
                       (model.out_std, out_std), (model.out_free, out_free)):
        buf.copy_(value)


@torch.no_grad()
def _copy_members(src: dict, dst: dict, members: torch.Tensor) -> None:
    """Per-member weights of the ``members`` mask from state dict ``src`` into ``dst`` (in place)."""
    for k, v in dst.items():
        if k.startswith(_MEMBER_KEYS):
            v[members] = src[k][members]


def fit(model: ProbabilisticEnsemble, opt: torch.optim.Optimizer, state: torch.Tensor, action: torch.Tensor,
        reward: torch.Tensor, next_state: torch.Tensor, terminated: torch.Tensor, cfg: EnsembleConfig,
        generator: torch.Generator) -> dict[str, float]:
    """Fit on transitions ``[T, ...]`` for ``cfg.epochs`` epochs (at most ``cfg.max_updates`` steps); each member
    ends with the weights of its best held-out epoch, and the elites are the members with the lowest held-out
    MSE. Returns the held-out MSE of the elites (standardized units), the training loss, and the step count."""
    x = torch.cat([state, action], 1)
    y = torch.cat([next_state - state, reward[:, None]], 1)
    done = terminated.float()
    t = x.shape[0]
    perm = torch.randperm(t, generator=generator, device=x.device)
    n_hold = min(int(t * cfg.holdout), cfg.holdout_max) if t >= 20 else 0
    hold, train = perm[:n_hold], perm[n_hold:]
    _set_standardization(model, x[train], y[train])

    def holdout_mse() -> torch.Tensor:
        if n_hold == 0:
            return torch.zeros(model.members, device=x.device)
        with torch.no_grad():
            mean, _, _ = model(x[hold].expand(model.members, -1, -1))
            return ((mean - (y[hold] - model.out_mean) / model.out_std) ** 2).mean((1, 2))

    best = holdout_mse()
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    batch = min(cfg.batch_size, train.numel())
    per_epoch = max(1, train.numel() // batch)
    steps, loss = 0, torch.zeros(())
    for _ in range(cfg.epochs):
        order = torch.argsort(torch.rand(model.members, train.numel(), generator=generator, device=x.device), 1)
        for i in range(per_epoch):
            if steps >= cfg.max_updates:
                break
            idx = train[order[:, i * batch:(i + 1) * batch]]  # [members, batch]: each member its own order
            loss = model.loss(x[idx], y[idx], done[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
        mse = holdout_mse()
        # without held-out rows nothing ranks the epochs: every epoch is kept (the last one wins)
        better = mse < best if n_hold else torch.ones_like(mse, dtype=torch.bool)
        if bool(better.any()):  # keep, per member, the weights of its best epoch
            best = torch.where(better, mse, best)
            _copy_members(model.state_dict(), snapshot, better)
        if steps >= cfg.max_updates:
            break
    with torch.no_grad():
        _copy_members(snapshot, model.state_dict(), torch.ones_like(best, dtype=torch.bool))
        model.elite_idx.copy_(torch.argsort(best)[: model.elite_idx.numel()])
    if not n_hold:
        best = torch.full_like(best, float("nan"))
    return {"model/holdout_mse": float(best[model.elite_idx].mean()), "model/train_loss": float(loss.detach()),
            "model/fit_steps": float(steps), "model/transitions": float(t)}
