"""Co-training (RLinf-Co): the cloning loss on demonstrations added to an RL learner's loss, so fine-tuning keeps
what the demonstrations taught. One piece for every learner that offers it (``<algo>.bc_coef`` with ``data=PATH``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embodied.algos.bc import episode_grounding, grounding_loss, state_noise_scale
from embodied.core.errors import UserError
from embodied.core.pixels import PixelPacker
from embodied.core.relabel import with_relabelled_copies


@dataclass
class CotrainConfig:
    """An RL learner's co-training settings (its config inherits them: ``grpo.bc_coef``, ``ppo.bc_relabel``, ...)."""

    bc_coef: float = 0.0  # weight of the cloning loss on demonstrations (needs data=PATH); 0: off
    bc_batch_size: int = 256
    # the loss the policy was cloned with (BC's ``obs_noise``, ``ground``, ``relabel``: state noise in standard
    # deviations of the dataset's, a pointer policy's grounding cross-entropy, relabelled copies of every
    # demonstration by the task's relabelling), as filtered-bc fine-tunes with them
    bc_obs_noise: float = 0.0
    bc_ground: float = 0.0
    bc_relabel: int = 0


def cotraining(cfg: CotrainConfig, ctx, policy: torch.nn.Module, device: torch.device, generator: torch.Generator,
               what: str) -> DemoLoss | None:
    """The co-training loss of the learner ``what`` (its ``cfg.bc_*`` settings over ``data=PATH``; the relabelled
    copies drawn with ``generator``), or None with ``bc_coef`` 0."""
    from embodied.algos.bc import relabel_copies

    if not cfg.bc_coef > 0:
        return None
    return DemoLoss(ctx.data, policy, ctx.obs_space["policy"].shape[0], device, cfg.bc_batch_size,
                    f"{what}.bc_coef", ctx.layout, obs_noise=cfg.bc_obs_noise, ground=cfg.bc_ground,
                    relabeller=ctx.relabeller, relabel=relabel_copies(f"{what}.bc_relabel", cfg.bc_relabel, ctx),
                    generator=generator)


class RowRing:
    """The newest ``capacity`` rows of named columns (``ring[k]: [capacity, ...]``): ``added`` rows ever written (the
    next one goes to ``added % capacity``), ``filled`` of them in use. Its state holds the rows in use."""

    capacity: int
    ring: dict[str, torch.Tensor]
    filled: int
    added: int

    def _write(self, rows: dict[str, torch.Tensor]) -> None:
        """Appends ``rows`` (columns of equal length); past ``capacity`` the oldest are overwritten."""
        m = next(iter(rows.values())).shape[0]
        if m > self.capacity:  # only the newest capacity rows could stay
            rows, m = {k: v[-self.capacity:] for k, v in rows.items()}, self.capacity
        if not self.ring:
            self._allocate(rows)
        at = (self.added + torch.arange(m, device=next(iter(rows.values())).device)) % self.capacity
        for k, v in rows.items():
            self.ring[k][at] = v
        self.added += m
        self.filled = min(self.capacity, self.filled + m)

    def _allocate(self, like: dict[str, torch.Tensor]) -> None:
        """The ring's columns, ``[capacity, ...]`` each, shaped and typed as the rows ``like``."""
        self.ring = {k: torch.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype, device=v.device)
                     for k, v in like.items()}

    def state_dict(self) -> dict:
        return {"ring": {k: v[:self.filled] for k, v in self.ring.items()}, "filled": self.filled, "added": self.added}

    def load_state_dict(self, state: dict) -> None:
        self.ring, self.filled, self.added = {}, int(state["filled"]), int(state["added"])
        if self.filled:
            self._allocate(state["ring"])
            for k, v in state["ring"].items():
                self.ring[k][:self.filled] = v


class DemoLoss(RowRing):
    """Minibatches of a recorded dataset and the policy's cloning loss on them: its own ``bc_loss`` where it has one
    (the VLA's cross-entropy on bins), else the action MSE of its deterministic output.

    With ``capacity`` > 0 it is also a pool that grows: ``extend`` adds episodes (a learner's own, e.g. the successful
    rollouts of filtered BC) to a ring of the newest ``capacity`` steps kept beside the dataset, and minibatches are
    drawn uniformly over both. With ``balance``, the added steps carry a group (``extend(..., group=)``: e.g. the task
    of a suite each came from) and the rows drawn from the ring give every group present the same share, however
    unequally the groups filled it. With ``weighted``, every added step carries a draw weight
    (``extend(..., weight=)``, e.g. its episode's discounted return) and the ring's rows are drawn in proportion to it
    (within their group's share, with ``balance``).

    BC's regularizers, so that fine-tuning clones with the loss the policy was cloned with: ``obs_noise`` (Gaussian
    noise on the state entries, in standard deviations of the dataset's) and ``ground`` (a pointer policy's grounding
    cross-entropy, its labels read off every episode, the dataset's and each added one: ``bc.episode_grounding``).
    ``relabel`` copies of every episode, the dataset's and each added one, relabelled by ``relabeller``
    (``core/relabel.py``, drawn with ``generator``), join it beside the episode (an added copy keeps its source's
    group)."""

    def __init__(self, path: str, policy: torch.nn.Module, obs_dim: int, device: torch.device, batch_size: int,
                 what: str, layout=None, capacity: int = 0, demo_ratio: float | None = None, obs_noise: float = 0.0,
                 ground: float = 0.0, balance: bool = False, relabeller=None, relabel: int = 0,
                 generator: torch.Generator | None = None, weighted: bool = False):
        from embodied.datasets import read_transitions

        if not path:
            raise UserError(f"{what} > 0 co-trains on demonstrations: give data=PATH")
        if batch_size < 1:
            raise UserError(f"{what}: the demonstration batch size must be >= 1, got {batch_size}")
        data = read_transitions(path, ["policy"])
        if data["state"].shape[1] != obs_dim:
            raise UserError(f"the dataset {path} has {data['state'].shape[1]} observation entries per step; the task "
                            f"has {obs_dim}")
        episode = (torch.cumsum(data["initial"].long(), 0) - 1).to(device)
        self._setup(policy, obs_dim, device, batch_size, layout, capacity, demo_ratio, obs_noise, ground, balance,
                    relabeller, relabel, generator, weighted)
        (state, episode), target = self._relabelled(data["state"].to(device),
                                                    self._targets(data["action"].to(device), episode), episode)[:2]
        self.data = {**self.packer.pack(state), "target": target}
        if self.ground:
            self.data["ground"] = self._labels(state, episode)
        if obs_noise > 0:
            self.noise_scale = state_noise_scale(state, layout, obs_noise)

    @classmethod
    def empty(cls, policy: torch.nn.Module, obs_dim: int, device: torch.device, batch_size: int, layout=None,
              capacity: int = 1, obs_noise: float = 0.0, ground: float = 0.0, balance: bool = False, relabeller=None,
              relabel: int = 0, generator: torch.Generator | None = None, weighted: bool = False) -> DemoLoss:
        """A pool without demonstrations, filled by ``extend`` alone (the noise's scale from the first steps added)."""
        self = cls.__new__(cls)
        self._setup(policy, obs_dim, device, batch_size, layout, capacity, None, obs_noise, ground, balance,
                    relabeller, relabel, generator, weighted)
        self.data = {**self.packer.pack(torch.zeros(0, obs_dim, device=device)),
                     "target": torch.zeros(0, self.horizon, 0, device=device)}
        if self.ground:
            self.data["ground"] = torch.zeros(0, 2, dtype=torch.long, device=device)
        return self

    def _setup(self, policy, obs_dim, device, batch_size, layout, capacity, demo_ratio, obs_noise, ground,
               balance, relabeller=None, relabel=0, generator=None, weighted=False) -> None:
        # camera entries kept as uint8 (core/pixels.py), unpacked per minibatch
        self.packer = PixelPacker.of(layout, "policy", obs_dim)
        self.horizon, self.batch_size, self.capacity = getattr(policy, "horizon", 1), batch_size, capacity
        self.demo_ratio = demo_ratio  # the dataset's share of a minibatch beside added steps (None: uniform)
        self.layout, self.obs_noise = layout, obs_noise
        self.noise_scale: torch.Tensor | None = None
        # a policy without entity pointers (an image policy) has nothing to ground
        self.ground = ground if getattr(policy, "pointers", None) is not None else 0.0
        self.policy = policy
        self.ring: dict[str, torch.Tensor] = {}  # the added steps' packed observations, "target" (and "ground")
        self.filled = 0  # rows of the ring in use
        self.added = 0  # steps ever added (the next row written is added % capacity)
        self.balance, self.weighted = balance, weighted
        self._cdf: torch.Tensor | None = None  # the ring rows' cumulative draw weights, made when needed
        self.relabeller, self.relabel, self.generator = relabeller, relabel if relabeller is not None else 0, generator

    def _relabelled(self, state: torch.Tensor, target: torch.Tensor, episode: torch.Tensor,
                    *columns: torch.Tensor | None):
        """``(state, episode)``, ``target`` and ``columns`` (per-row values a copy repeats: a group, a weight) of whole
        episodes (``episode`` numbered 0..n-1) with the ``relabel`` relabelled copies of each appended (episodes
        numbered on), and the count of the copies' rows."""
        if not self.relabel or not len(episode):
            return (state, episode), target, columns, 0
        more, episode, target, *columns = with_relabelled_copies(self.relabeller, state, episode, self.relabel,
                                                                 self.generator, target, *columns)
        return (more, episode), target, columns, len(more) - len(state)

    @torch.no_grad()
    def _labels(self, state: torch.Tensor, episode: torch.Tensor) -> torch.Tensor:
        return episode_grounding(self.policy, state, episode)

    @property
    def obs(self) -> dict[str, torch.Tensor]:
        """The dataset's packed observations."""
        return {k: v for k, v in self.data.items() if k not in ("target", "ground")}

    @property
    def target(self) -> torch.Tensor:
        return self.data["target"]

    def _targets(self, action: torch.Tensor, episode: torch.Tensor) -> torch.Tensor:
        from embodied.algos.bc import chunk_targets

        return chunk_targets(action.clamp(-1.0, 1.0), episode, self.horizon)

    @property
    def size(self) -> int:
        """Steps minibatches are drawn from: the dataset's and the added ones kept."""
        return self.target.shape[0] + self.filled

    @torch.no_grad()
    def extend(self, obs: dict[str, torch.Tensor], action: torch.Tensor, episode: torch.Tensor,
               group: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> None:
        """Adds steps: ``obs`` packed as the packer packs them, ``action [M, act_dim]``, ``episode [M]`` (each step's
        episode, episodes contiguous), with ``balance`` each step's ``group [M]`` (integers >= 0) and with
        ``weighted`` its draw weight ``[M]`` (> 0); past ``capacity`` the oldest added steps are overwritten."""
        if self.capacity < 1:
            raise ValueError("this DemoLoss was built without a capacity for added steps")
        if self.balance and group is None:
            raise ValueError("a balanced pool needs each added step's group")
        if self.weighted and weight is None:
            raise ValueError("a weighted pool needs each added step's weight")
        numbered = torch.unique_consecutive(episode, return_inverse=True)[1]  # episodes numbered 0, 1, ...
        target = self._targets(action, numbered)
        m = target.shape[0]
        extra = {**({"group": group.long()} if self.balance else {}),
                 **({"weight": weight.double()} if self.weighted else {})}
        rows = {**obs, "target": target, **extra}
        if self.ground or self.relabel or (self.obs_noise > 0 and self.noise_scale is None):
            state = self.packer.unpack_rows(obs, torch.arange(m, device=numbered.device))
            (state, numbered), target, columns, copies = self._relabelled(state, target, numbered, *extra.values())
            if copies:
                rows = {**self.packer.pack(state), "target": target, **dict(zip(extra, columns))}
            if self.ground:
                rows["ground"] = self._labels(state, numbered)
            if self.obs_noise > 0 and self.noise_scale is None:
                self.noise_scale = state_noise_scale(state, self.layout, self.obs_noise)
        self._write(rows)
        self._cdf = None

    @property
    def _drawn_by_weight(self) -> bool:
        """Whether the ring's rows are drawn by ``ring_weights`` (a balanced or weighted pool with rows added)."""
        return (self.balance and "group" in self.ring) or (self.weighted and "weight" in self.ring)

    def ring_weights(self) -> torch.Tensor:
        """``[filled]``: each ring row's chance of being drawn: its weight over the ring's total (1 without
        ``weighted``); with ``balance``, its weight over its group's total, divided by the groups present."""
        w = self.ring["weight"][:self.filled].double().cpu() if self.weighted and "weight" in self.ring \
            else torch.ones(self.filled, dtype=torch.float64)
        if not (self.balance and "group" in self.ring):
            return w / w.sum().clamp_min(1e-300) if self.filled else w
        group = self.ring["group"][:self.filled].cpu()
        total = torch.zeros(int(group.max()) + 1, dtype=torch.float64).index_add_(0, group, w)
        return w / (total[group] * int((total > 0).sum()))

    def _ring_rows(self, k: int, generator: torch.Generator) -> torch.Tensor:
        """``k`` ring rows drawn with ``ring_weights`` (uniformly in a pool neither balanced nor weighted)."""
        if not self._drawn_by_weight:
            return torch.randint(self.filled, (k,), generator=generator, device=generator.device)
        if self._cdf is None:
            self._cdf = self.ring_weights().to(self.ring["target"].device).cumsum(0)
        u = torch.rand(k, generator=generator, device=generator.device, dtype=torch.float64) * self._cdf[-1]
        return torch.searchsorted(self._cdf, u, right=True).clamp_max(self.filled - 1)

    def sample(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A minibatch ``(obs, target)`` drawn uniformly over the dataset's and the added steps, or with
        ``demo_ratio`` set, that fraction of it from the dataset and the rest from the added steps (RLPD's symmetric
        sampling: the demonstrations keep their weight however many steps are added)."""
        rows = self._draw(generator)
        return self.packer.unpack_rows(rows, slice(None)), rows["target"]

    def _draw(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """A minibatch's rows (packed observations, ``target``, ``ground``)."""
        n_data = self.target.shape[0]
        j = torch.randint(self.size, (self.batch_size,), generator=generator, device=generator.device)
        if not self.filled:
            return {k: v[j] for k, v in self.data.items()}
        if not n_data:
            j = self._ring_rows(self.batch_size, generator) if self._drawn_by_weight else j
            return {k: v[j] for k, v in self.ring.items() if k not in ("group", "weight")}
        if self.demo_ratio is None:
            ring = j >= n_data
            j_data, j_ring = j[~ring], j[ring] - n_data
            if self._drawn_by_weight:
                j_ring = self._ring_rows(j_ring.numel(), generator)
        else:
            k = round(self.demo_ratio * self.batch_size)
            j_data = torch.randint(n_data, (k,), generator=generator, device=generator.device)
            j_ring = self._ring_rows(self.batch_size - k, generator)
        return {k: torch.cat([self.data[k][j_data], self.ring[k][j_ring]]) for k in self.data}

    def __call__(self, policy: torch.nn.Module, generator: torch.Generator, **loss_args) -> torch.Tensor:
        """The cloning loss on one minibatch; ``loss_args`` go to the policy's ``bc_loss``."""
        rows = self._draw(generator)
        obs, target = self.packer.unpack_rows(rows, slice(None)), rows["target"]
        if self.noise_scale is not None:
            obs = obs + torch.randn(obs.shape, generator=generator, device=obs.device) * self.noise_scale
        if not hasattr(policy, "bc_loss"):
            return ((policy(obs) - target[:, 0]) ** 2).mean()
        loss = policy.bc_loss(obs, target, **loss_args)
        if self.ground:
            loss = loss + self.ground * grounding_loss(policy, obs, rows["ground"])[0]
        return loss

    def state_dict(self) -> dict:
        """The added steps (the dataset is read again from its path)."""
        return super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._cdf = None
