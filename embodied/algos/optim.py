"""Adam for the off-policy learners' many small gradient steps: ``torch.optim.Adam(fused=True)``'s
update (the same ``torch._fused_adam_`` kernel, L2 weight decay) without ``torch.optim``'s
per-step Python machinery and without ``.grad`` bookkeeping: gradients come in explicitly, as
``torch.autograd.grad`` returns them, and clipping is one foreach pass.

For 64-unit networks on a CPU the update itself is microseconds; ``Optimizer.step``'s wrappers,
``zero_grad`` and gradient accumulation were ~0.4 ms of a ~1.9 ms TD3 step (torch profiler), and
building a ``torch.optim`` optimizer imports ``torch._dynamo`` (~1.5 s at every training start)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch.autograd.graph import increment_version


class FusedAdam:
    """Parameter groups ``[{"params": [...], "lr": ..., "weight_decay": ...}, ...]``; ``step(grads)``
    takes ``{group index: gradients of that group's params}`` and updates only those groups (a
    group left out neither moves nor advances its step count, as with ``grad=None`` in torch)."""

    def __init__(self, groups: Sequence[Mapping], betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.groups = [{"params": list(g["params"]), "lr": float(g["lr"]),
                        "weight_decay": float(g.get("weight_decay", 0.0))} for g in groups]
        self.betas, self.eps = betas, eps
        self.exp_avg = [[torch.zeros_like(p) for p in g["params"]] for g in self.groups]
        self.exp_avg_sq = [[torch.zeros_like(p) for p in g["params"]] for g in self.groups]
        self.steps = [[torch.zeros((), dtype=torch.float32, device=p.device) for p in g["params"]]
                      for g in self.groups]

    @torch.no_grad()
    def step(self, grads: Mapping[int, Sequence[torch.Tensor]]) -> None:
        for i, group_grads in grads.items():
            g = self.groups[i]
            torch._foreach_add_(self.steps[i], 1)
            torch._fused_adam_(g["params"], list(group_grads), self.exp_avg[i], self.exp_avg_sq[i], [],
                               self.steps[i], amsgrad=False, lr=g["lr"], beta1=self.betas[0], beta2=self.betas[1],
                               weight_decay=g["weight_decay"], eps=self.eps, maximize=False)
            # the fused kernel writes the parameters without bumping their version counters, as every in-place
            # op does: bumped here, so what is keyed on them (autograd's saved-tensor check, GroupMLP's weights
            # assembled for acting) sees the change
            increment_version(g["params"])

    def state_dict(self) -> dict:
        return {"exp_avg": [[t.clone() for t in ts] for ts in self.exp_avg],
                "exp_avg_sq": [[t.clone() for t in ts] for ts in self.exp_avg_sq],
                "steps": [[t.clone() for t in ts] for ts in self.steps],
                "lr": [g["lr"] for g in self.groups], "weight_decay": [g["weight_decay"] for g in self.groups]}

    def load_state_dict(self, state: Mapping) -> None:
        for name in ("exp_avg", "exp_avg_sq", "steps"):
            for mine, saved in zip(getattr(self, name), state[name], strict=True):
                for t, s in zip(mine, saved, strict=True):
                    t.copy_(s)


@torch.no_grad()
def clip_grad_norm_(grads: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale ``grads`` in place so their global L2 norm is at most ``max_norm`` (what
    ``torch.nn.utils.clip_grad_norm_`` does, on a gradient list). Returns the norm before clipping."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


LR_SCHEDULES = ("constant", "linear")


def check_lr_schedule(name: str, schedule: str) -> None:
    """``schedule`` is one of LR_SCHEDULES; else a UserError naming the setting ``name``."""
    if schedule not in LR_SCHEDULES:
        from embodied.core.errors import UserError

        raise UserError(f"{name} must be constant or linear, got {schedule!r}")


def anneal_linear(groups: Sequence[dict], base_lrs: Sequence[float], done: float, total: float) -> None:
    """Each group's learning rate at ``done`` of ``total`` steps of a linear schedule: its base rate falling to 0 at
    ``total`` (CleanRL's anneal_lr)."""
    frac = max(0.0, 1.0 - done / total)
    for group, lr in zip(groups, base_lrs):
        group["lr"] = lr * frac
