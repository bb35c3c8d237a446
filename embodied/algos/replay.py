"""Replay buffer for off-policy learners, on the learner device."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from embodied.core.errors import UserError


class ReplayBuffer:
    """Circular buffer of transitions in one ``[capacity, width]`` tensor, so that a sample is a
    single gather (a gather per field cost ~7x more per update on CPU); fields are column slices."""

    def __init__(self, capacity: int, obs_dim: int, cobs_dim: int, act_dim: int, device: torch.device):
        self.capacity, self.size, self.pos = int(capacity), 0, 0
        # discount: the factor of the bootstrap value, gamma^m (1 - terminated) for an m-step row
        widths = {"obs": obs_dim, "cobs": cobs_dim, "action": act_dim, "reward": 1, "discount": 1,
                  "next_obs": obs_dim, "next_cobs": cobs_dim}
        self.slices, start = {}, 0
        for k, w in widths.items():
            self.slices[k] = slice(start, start + w)
            start += w
        self.storage = torch.zeros(self.capacity, start, device=device)

    def add(self, **batch: torch.Tensor) -> None:
        n = batch["reward"].shape[0]
        self.add_rows(torch.cat([batch[k].reshape(n, -1) for k in self.slices], 1))

    def add_rows(self, row: torch.Tensor) -> None:
        """Whole rows ``[n, width]``, their fields already in column order (``slices``)."""
        n = row.shape[0]
        if n > self.capacity:  # only the newest `capacity` rows survive; keep the slot they would take
            self.pos = (self.pos + n - self.capacity) % self.capacity
            self.size = min(self.size + n - self.capacity, self.capacity)
            row, n = row[-self.capacity:], self.capacity
        end = self.pos + n
        if end <= self.capacity:
            self.storage[self.pos:end] = row
        else:
            first = self.capacity - self.pos
            self.storage[self.pos:] = row[:first]
            self.storage[: n - first] = row[first:]
        self.pos = end % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator, transform=None) -> dict[str, torch.Tensor]:
        """``batch_size`` rows drawn uniformly; ``transform(rows [B, width])`` may rewrite whole rows
        (e.g. a random symmetry per row) before they are split into fields."""
        idx = torch.randint(self.size, (batch_size,), generator=generator, device=generator.device)
        rows = self.storage.index_select(0, idx)
        if transform is not None:
            rows = transform(rows)
        out = {k: rows[:, s] for k, s in self.slices.items()}
        out["reward"] = out["reward"].squeeze(1)
        out["discount"] = out["discount"].squeeze(1)
        return out

    def state_dict(self) -> dict:
        return {"size": self.size, "pos": self.pos, "capacity": self.capacity,
                "storage": self.storage[: self.size].clone()}

    def load_state_dict(self, state: Mapping) -> None:
        size, pos, rows = int(state["size"]), int(state["pos"]), state["storage"]
        if int(state.get("capacity", self.capacity)) != self.capacity:
            # the buffer was sized for another budget (a resumed run that extends total_steps):
            # lay the rows out oldest first, keep the newest that fit, continue after them
            if size == int(state["capacity"]):
                rows = torch.cat([rows[pos:], rows[:pos]])
            rows = rows[-self.capacity:]
            size = rows.shape[0]
            pos = size % self.capacity
        self.size, self.pos = size, pos
        self.storage[:size] = rows


class NStepReturns:
    """Turns batched one-step transitions into n-step replay rows (FastTD3 trains on 3-step returns):

        reward   = sum_{k<m} gamma^k r_{t+k}
        discount = gamma^m (1 - terminated_{t+m-1}),   next_obs = s_{t+m}

    where m = n, or fewer when the episode ends (terminated or truncated) inside the window, so no
    row reaches across an episode boundary; a truncated row bootstraps from the true final
    observation. Each env keeps its last n starts in ``[n, N]`` slots; a row is emitted the step its
    window closes. n = 1 gives the usual one-step rows, in env order."""

    def __init__(self, n: int, gamma: float, num_envs: int, head_dim: int, device: torch.device):
        if n < 1:
            raise UserError(f"n_step must be >= 1, got {n}")
        self.n, self.gamma, self.t = int(n), float(gamma), 0
        self.head = torch.zeros(n, num_envs, head_dim, device=device)  # obs | cobs | action at the start
        self.ret = torch.zeros(n, num_envs, device=device)
        self.count = torch.zeros(n, num_envs, dtype=torch.long, device=device)  # rewards summed so far
        self.live = torch.zeros(n, num_envs, dtype=torch.bool, device=device)

    def push(self, head: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
             tail: torch.Tensor, fresh: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """One step of every env: ``head [N, H]`` (what starts a row), ``tail [N, T]`` (what ends
        one: next observations). Returns the closed rows' ``head, reward, discount, tail``.
        ``fresh [N]``: envs whose step does not follow their previous one (``Transition.fresh``);
        their open windows are dropped, never linked across the gap. On CPU, the numba kernel
        (``embodied/kernels/replay_numba.py``); ``_push_torch`` is the reference."""
        if self.head.device.type != "cpu":
            return self._push_torch(head, reward, terminated, truncated, tail, fresh)
        from embodied.kernels.replay_numba import nstep_push

        envs = reward.shape[0]
        s = self.t % self.n
        self.t += 1
        out_head = torch.empty(self.n * envs, head.shape[1])
        out_ret, out_discount = torch.empty(self.n * envs), torch.empty(self.n * envs)
        out_env = torch.empty(self.n * envs, dtype=torch.long)
        no_gap = fresh is None
        m = nstep_push(self.head.numpy(), self.ret.numpy(), self.count.numpy(), self.live.numpy(), s,
                       head.detach().contiguous().numpy(), reward.detach().contiguous().numpy(),
                       terminated.numpy(), truncated.numpy(),
                       np.zeros(envs, dtype=np.bool_) if no_gap else fresh.numpy(), self.gamma,
                       out_head.numpy(), out_ret.numpy(), out_discount.numpy(), out_env.numpy())
        return out_head[:m], out_ret[:m], out_discount[:m], tail[out_env[:m]]

    def _push_torch(self, head: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor,
                    truncated: torch.Tensor, tail: torch.Tensor, fresh: torch.Tensor | None = None):
        if fresh is not None:
            self.live &= ~fresh[None]
        s = self.t % self.n
        self.t += 1
        self.head[s], self.ret[s], self.count[s], self.live[s] = head, 0.0, 0, True
        live = self.live.float()
        self.ret += live * torch.pow(self.gamma, self.count.float()) * reward[None]
        self.count += self.live.long()
        emit = self.live & ((self.count == self.n) | (terminated | truncated)[None])
        slot, env = emit.nonzero(as_tuple=True)
        self.live &= ~emit
        discount = torch.pow(self.gamma, self.count[slot, env].float()) * (1.0 - terminated[env].float())
        return self.head[slot, env], self.ret[slot, env], discount, tail[env]

    def state_dict(self) -> dict:
        return {"t": self.t, "head": self.head.clone(), "ret": self.ret.clone(), "count": self.count.clone(),
                "live": self.live.clone()}

    def load_state_dict(self, state: Mapping) -> None:
        self.t = int(state["t"])
        for k in ("head", "ret", "count", "live"):
            getattr(self, k).copy_(state[k])
