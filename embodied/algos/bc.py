"""Behaviour cloning: a deterministic MLP policy regressed onto the actions of a recorded dataset (``data=PATH``, a
Minari dataset such as ``embodied collect-demos`` writes), in the offline runner: every ``update`` is one gradient
step on a minibatch; ``total_steps`` counts gradient steps. The policy is the TD3 actor (``tanh`` output: actions
in [-1, 1]) with its observation normalizer fitted on the whole dataset, so it exports like every policy.

With ``bc.chunk=H`` (> 1) the policy is action-chunked (ACT style, ``policies/chunked.py``): it predicts the next
``H`` actions of the demonstration from each step (the chunk padded with the episode's last action past its end)
and executes the first ``bc.execute`` of them (default ``H // 2``) before it looks again. ``bc.head=flow`` learns the
chunk with a flow-matching head (``policies/flow.py``: multimodal demonstrations without averaging their modes).
``bc.ensemble=m`` acts with ACT's temporal ensembling (the network every step, the chunks' predictions averaged).

A tenth of the episodes (at least one) is held out: ``bc/val_loss`` is the cloning loss on them (the action MSE,
or the policy's own loss: the flow head's, the VLA's)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from embodied.algos.base import OFFLINE, Algorithm, BuildContext, Obs, Transition
from embodied.core.errors import UserError
from embodied.core.pixels import PixelPacker
from embodied.core.registry import ALGOS
from embodied.core.relabel import with_relabelled_copies
from embodied.policies import ChunkedActor, DeterministicActor, FlowChunkActor, update_normalizer

VAL_EVERY = 200  # gradient steps between two held-out losses
VAL_ROWS = 4096  # held-out rows per forward pass


@dataclass
class BCConfig:
    lr: float = 1e-3
    batch_size: int = 256
    weight_decay: float = 1e-4
    max_grad_norm: float = 1.0
    holdout: float = 0.1  # fraction of the episodes held out for the validation loss
    chunk: int = 1  # actions predicted per observation; 1: a per-step MLP policy
    execute: int = 0  # of a chunk, the actions executed before the policy looks again; 0: chunk // 2 (at least 1)
    head: str = "mse"  # mse: regress the chunk (tanh MLP); flow: a flow-matching chunk head (policies/flow.py)
    flow_steps: int = 10  # the flow head's Euler steps per chunk
    ensemble: float | None = None  # a chunked policy's temporal ensembling (ACT: 0.01): look every step, average
    # Gaussian noise on the training inputs' state entries (not images, not the instruction), in units of each
    # entry's standard deviation over the dataset: a regularizer against over-fitting a few demonstrations
    obs_noise: float = 0.0
    # a VLA with entity pointers (policy.vla.state_encoder=pointers): weight of a cross-entropy that points its first
    # pointer at the object each demonstration moved and its second at what that object came to rest on (labels
    # read off the episode itself: ``grounding_labels``); 0: the pointers learn from the cloning loss alone
    ground: float = 0.0
    # relabelled copies of every training episode added to the dataset (the task's relabelling, ``core/relabel.py``:
    # mini-libero's cubes renamed by a permutation of their colours, the instruction with them); 0: none
    relabel: int = 0


def grounding_labels(position: torch.Tensor, episode: torch.Tensor, near: float = 0.05, moved_at_least: float = 0.01,
                     above: float = 0.06) -> tuple[torch.Tensor, torch.Tensor]:
    """Per step of a flat dataset (``position [T, E, 3]``: each entity's position; ``episode [T]``, contiguous): the
    entity its episode moved (the farthest from its start at the episode's end; -1 where none moved
    ``moved_at_least`` [m]) and the one it ended on (the nearest other entity in the horizontal plane within
    ``near`` [m] of it and less than ``above`` [m] over or under it, else -1: held up, dropped, or nothing moved; a
    cube held up over another is on nothing: mini-libero's lift expert once ended 10 cm over a neighbour)."""
    t = torch.arange(len(episode), device=position.device)
    n = int(episode.max()) + 1 if len(episode) else 0
    first = torch.full((n,), len(episode), device=t.device, dtype=torch.long).scatter_reduce(0, episode, t, "amin")
    last = torch.zeros(n, device=t.device, dtype=torch.long).scatter_reduce(0, episode, t, "amax")
    shift, moved = (position[last] - position[first]).norm(dim=-1).max(1)  # [n]
    rows = torch.arange(n, device=t.device)
    end = position[last]  # [n, E, 3]
    gap = (end[..., :2] - end[rows, moved][:, None, :2]).norm(dim=-1)
    gap[rows, moved] = float("inf")
    dist, onto = gap.min(1)
    height = (end[rows, moved, 2] - end[rows, onto, 2]).abs()
    onto = torch.where((dist < near) & (height < above) & (shift >= moved_at_least), onto, torch.full_like(onto, -1))
    moved = torch.where(shift >= moved_at_least, moved, torch.full_like(moved, -1))
    return moved[episode], onto[episode]


def relabel_copies(what: str, copies: int, ctx: BuildContext) -> int:
    """The relabelled copies a learner's ``relabel`` setting makes: a negative count is a ``UserError``; a task
    without a relabelling (mini-libero with image observations) makes none, said in one line."""
    if copies < 0:
        raise UserError(f"{what} is a number of relabelled copies: >= 0, got {copies}")
    if copies > 0 and ctx.relabeller is None:
        print(f"{what}: this task has no relabelling of its episodes (mini-libero's has, with state observations): "
              "no copies", file=sys.stderr)
        return 0
    return copies


def state_noise_scale(obs: torch.Tensor, layout, scale: float) -> torch.Tensor:
    """``[D]``: ``scale`` times each state entry's standard deviation over ``obs [T, D]``; 0 on images and the
    instruction (a task without a layout: every entry). The std of cloning's Gaussian input noise (``obs_noise``)."""
    from embodied.vla.build import state_terms

    std = obs.std(0) if obs.shape[0] > 1 else torch.zeros(obs.shape[1], device=obs.device)
    if layout is None or "policy" not in layout.observation:
        return scale * std
    keep = torch.zeros_like(std)
    for start, size, _ in state_terms(layout):
        keep[start:start + size] = 1.0
    return scale * std * keep


def episode_grounding(policy, obs: torch.Tensor, episode: torch.Tensor) -> torch.Tensor:
    """``[T, 2]``: the labels of a pointer policy's first two pointers on steps ``obs [T, D]`` of whole episodes
    (``episode [T]``, contiguous): what each episode moved and what it came to rest on (``grounding_labels``)."""
    position = policy.pointers.entities(policy.split(obs)[0])
    return torch.stack(grounding_labels(position, episode), 1)


def grounding_loss(policy, obs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The first two pointers' cross-entropy against ``labels [B, 2]`` (-1: unknown, ignored), averaged over the
    known ones, and its figures (``ground_loss``, ``ground_hit``: the share of known labels the argmax hits)."""
    logits = policy.pointer_logits(obs)[:, :2]
    known = (labels >= 0).sum().clamp_min(1)  # a batch without labels adds nothing
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1,
                                       reduction="sum") / known
    hit = float(((logits.argmax(-1) == labels) & (labels >= 0)).sum() / known)
    return loss, {"ground_loss": float(loss.detach()), "ground_hit": hit}


def chunk_targets(action: torch.Tensor, episode: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[T, chunk, act_dim]``: for each step of a flat dataset (``episode [T]``: each step's episode index, episodes
    contiguous) the actions of it and the ``chunk - 1`` steps after it, the episode's last action repeated past its
    end."""
    t = torch.arange(len(episode), device=action.device)
    last = torch.zeros_like(episode).scatter_reduce(0, episode, t, "amax")[episode]  # each step's episode's end
    return action[torch.minimum(t[:, None] + torch.arange(chunk, device=action.device), last[:, None])]


class BC(Algorithm):
    paradigm = OFFLINE
    config_cls = BCConfig

    @classmethod
    def build(cls, cfg: BCConfig, ctx: BuildContext) -> BC:
        from embodied.datasets import read_transitions

        if not ctx.data:
            raise UserError("bc learns from a dataset: give data=PATH (a Minari dataset, e.g. from embodied "
                            "collect-demos)")
        if not isinstance(ctx.action_space, gym.spaces.Box):
            raise UserError("bc needs continuous (Box) actions")
        if cfg.batch_size < 1 or not 0 <= cfg.holdout < 1:
            raise UserError(f"bc: batch_size >= 1 and holdout in [0, 1), got {cfg.batch_size}, {cfg.holdout}")
        if cfg.chunk < 1 or not 0 <= cfg.execute <= cfg.chunk:
            raise UserError(f"bc: chunk >= 1 and execute in 0..chunk, got {cfg.chunk}, {cfg.execute}")
        if cfg.head not in ("mse", "flow") or cfg.flow_steps < 1:
            raise UserError(f"bc: head is mse or flow and flow_steps >= 1, got {cfg.head!r}, {cfg.flow_steps}")
        if not cfg.ground >= 0:
            raise UserError(f"bc.ground is a loss weight: >= 0, got {cfg.ground}")
        if cfg.ground > 0 and (ctx.policy.arch != "vla" or ctx.policy.vla.state_encoder != "pointers"):
            raise UserError("bc.ground trains entity pointers: it needs policy.arch=vla "
                            "policy.vla.state_encoder=pointers")
        if not cfg.obs_noise >= 0:
            raise UserError(f"bc.obs_noise is a noise scale in standard deviations: >= 0, got {cfg.obs_noise}")
        data = read_transitions(ctx.data, ["policy"])
        obs_dim, act_dim = ctx.obs_space["policy"].shape[0], ctx.action_space.shape[0]
        if (data["state"].shape[1], data["action"].shape[1]) != (obs_dim, act_dim):
            raise UserError(f"the dataset {ctx.data} has {data['state'].shape[1]} observation / "
                            f"{data['action'].shape[1]} action entries per step; the task has {obs_dim} / {act_dim}")
        return cls(cfg, ctx, data)

    def __init__(self, cfg: BCConfig, ctx: BuildContext, data: dict[str, torch.Tensor]):
        self.cfg, self.device = cfg, torch.device(ctx.device)
        p = ctx.policy
        obs_dim, act_dim = data["state"].shape[1], data["action"].shape[1]
        torch.manual_seed(ctx.seed)
        self.description: dict = {}
        if p.arch == "vla":  # a language-conditioned policy: bins (or a Gaussian chunk) over its own chunk
            from embodied.vla.build import build_vla

            self.pi = build_vla(ctx, act_dim)
            self.description = getattr(self.pi, "description", {})
            self.pi.fit_action_range(data["action"].clamp(-1.0, 1.0))
        elif cfg.head == "flow" or cfg.chunk > 1:
            execute = cfg.execute or max(1, cfg.chunk // 2)
            self.pi = FlowChunkActor(obs_dim, act_dim, p.actor_hidden, cfg.chunk, execute, cfg.flow_steps,
                                     p.activation, p.obs_normalization, cfg.ensemble) if cfg.head == "flow" else \
                ChunkedActor(obs_dim, act_dim, p.actor_hidden, cfg.chunk, execute, p.activation, p.obs_normalization,
                             cfg.ensemble)
        else:
            self.pi = DeterministicActor(obs_dim, act_dim, p.actor_hidden, p.activation, p.obs_normalization)
        self.pi.to(self.device)
        self.opt = torch.optim.AdamW(self.pi.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(ctx.seed)
        # hold out whole episodes (steps of one episode are near copies of each other)
        episode = torch.cumsum(data["initial"].long(), 0) - 1
        n_ep = int(episode[-1]) + 1
        n_val = max(1, round(cfg.holdout * n_ep)) if cfg.holdout > 0 and n_ep > 1 else 0
        order = torch.randperm(n_ep, generator=torch.Generator().manual_seed(ctx.seed))
        val = torch.isin(episode, order[:n_val]).to(self.device)
        obs, action = data["state"].to(self.device), data["action"].clamp(-1.0, 1.0).to(self.device)
        episode = episode.to(self.device)
        horizon = getattr(self.pi, "horizon", 1)
        if horizon > 1 or hasattr(self.pi, "bc_loss"):
            action = chunk_targets(action, episode, horizon)
        self.val_obs, self.val_action = obs[val], action[val]
        obs, action, episode = obs[~val], action[~val], torch.unique_consecutive(episode[~val], return_inverse=True)[1]
        copies = relabel_copies("bc.relabel", cfg.relabel, ctx)
        if copies:
            obs, episode, action = with_relabelled_copies(ctx.relabeller, obs, episode, copies, self.generator, action)
        update_normalizer(self.pi, obs)
        self.ground = None
        if cfg.ground > 0 and getattr(self.pi, "pointers", None) is None:  # an image policy: no pointers
            print("bc.ground: the policy has no entity pointers (image input): no grounding loss", file=sys.stderr)
        elif cfg.ground > 0:  # [T, 2] labels of the two first pointers
            self.ground = episode_grounding(self.pi, obs, episode)
        # camera entries kept as uint8 (a 2-camera 64x64 step: 24.6 KB, not 98 KB), unpacked per minibatch
        self.packer = PixelPacker.of(ctx.layout, "policy", obs_dim)
        self.obs, self.action = self.packer.pack(obs), action
        self.val_obs = self.packer.pack(self.val_obs)
        self.noise_scale = state_noise_scale(obs, ctx.layout, cfg.obs_noise) if cfg.obs_noise > 0 else None
        del obs
        self.num_updates = 0
        self._val_loss = float("nan")
        self.label_smoothing, self.label_sigma = p.vla.label_smoothing, p.vla.label_sigma
        self.text_noise = p.vla.text_noise

    def act(self, obs: Obs) -> torch.Tensor:
        return self.pi.act(obs["policy"])

    def observe(self, transition: Transition) -> None:  # offline: nothing is collected
        pass

    def update(self) -> dict[str, float]:
        idx = torch.randint(self.action.shape[0], (self.cfg.batch_size,), generator=self.generator,
                            device=self.device)
        obs = self.packer.unpack_rows(self.obs, idx)
        if self.noise_scale is not None:
            obs = obs + torch.randn(obs.shape, generator=self.generator, device=self.device) * self.noise_scale
        loss = self.loss(obs, self.action[idx])
        extra = {}
        if self.ground is not None:
            ground, figures = grounding_loss(self.pi, obs, self.ground[idx])
            extra = {f"bc/{k}": v for k, v in figures.items()}
            loss = loss + self.cfg.ground * ground
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.pi.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        self.num_updates += 1
        num_val = self.val_action.shape[0]
        if num_val and self.num_updates % VAL_EVERY == 1:
            with torch.no_grad():  # in slices of VAL_ROWS, weighted by their rows (a pixel set is large)
                total = 0.0
                for start in range(0, num_val, VAL_ROWS):
                    rows = torch.arange(start, min(start + VAL_ROWS, num_val), device=self.device)
                    total += float(self.loss(self.packer.unpack_rows(self.val_obs, rows),
                                             self.val_action[rows])) * len(rows)
                self._val_loss = total / num_val
        out = {"bc/loss": float(loss.detach()), "bc/val_loss": self._val_loss,
               "bc/dataset_steps": float(self.action.shape[0]), **extra}
        if self.num_updates == 1:  # the policy's size and speed, once in the run's metrics
            out.update({f"policy/{k}": float(v) for k, v in self.description.items()})
        return out

    def loss(self, obs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The policy's own cloning loss where it has one (the VLA's cross-entropy on bins, the flow head's velocity
        loss), else the action MSE."""
        if hasattr(self.pi, "bc_loss"):
            noise = self.text_noise if torch.is_grad_enabled() else 0.0  # the held-out loss: clean instructions
            return self.pi.bc_loss(obs, target, label_smoothing=self.label_smoothing, label_sigma=self.label_sigma,
                                   text_noise=noise, generator=self.generator)
        return ((self.pi(obs) - target) ** 2).mean()

    def actor(self) -> nn.Module:
        return self.pi

    def state_dict(self) -> dict:
        return {"pi": self.pi.state_dict(), "opt": self.opt.state_dict(), "generator": self.generator.get_state(),
                "num_updates": self.num_updates, "val_loss": self._val_loss}

    def load_state_dict(self, state: Mapping) -> None:
        self.pi.load_state_dict(state["pi"])
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.num_updates, self._val_loss = int(state["num_updates"]), float(state["val_loss"])


ALGOS.register("bc", BC)
