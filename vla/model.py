"""A vision-language-action policy small enough to train on two CPU cores (reference: ``subsystems.md`` 4.8).

The input is one flat observation vector (the task's ``policy`` group): an instruction term (the frozen MiniLM
embedding, ``[start, 384]``), optionally one image term (``[start, C, H, W]``, cameras stacked as channels, values in
[0, 1]), and everything else is state (proprioception, object state), normalized inside the module.

- vision: ``cnn`` (4 conv blocks, stride 2, GroupNorm, SiLU, each FiLM-modulated by the instruction as in RT-1,
  then global average pooling) or ``vit`` (patch 8, width 128, depth 4, 4 heads, the instruction as an extra token);
- language: the embedding projected to 128 and concatenated at the trunk (and the FiLM / token conditioning);
- trunk: Linear-LayerNorm-SiLU, Linear-SiLU at ``width``;
- heads: ``tokens`` (OpenVLA's 256 bins per action dimension over a chunk of ``chunk`` actions: logits
  ``[B, chunk, act_dim, bins]``, percentile-normalized with the dataset's range, ``tokenizer.py``) or
  ``continuous`` (a tanh Gaussian-mean chunk with a learned state-independent std); a value head (PPO).

``act`` runs the deterministic path (the most likely bin, or the mean) through a per-env chunk queue that executes
``execute`` actions of each chunk; RL acts on the chunk's first action (``dist``), so every step is a decision."""

from __future__ import annotations

import math

import torch
from torch import nn

from embodied.policies.actor_critic import POLICIES, MultiCategorical
from embodied.policies.chunked import ChunkQueue
from embodied.policies.normalizer import EmpiricalNormalizer
from embodied.vla.tokenizer import bin_position, decode_bins, encode_bins

TEXT_FEATURES = 128
STATE_FEATURES = 128
LOG_STD_MIN, LOG_STD_MAX = -5.0, 1.0
RELATION_SCALE = 0.05  # [m] the unit of the pointers' relation (``relation``): a 3 mm misalignment reads 0.06


def _transformer(dim: int, depth: int, heads: int) -> nn.TransformerEncoder:
    """``depth`` pre-norm transformer layers of width ``dim`` (GELU, feed-forward ``2 dim``, no dropout)."""
    layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True)
    return nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)


class FiLMConvEncoder(nn.Module):
    """``[B, C*H*W]`` image and ``[B, T]`` text -> ``[B, channels[-1]]``. FiLM: ``x <- x (1 + gamma) + beta`` after
    each block's norm, ``(gamma, beta)`` a linear map of the text (zero at init: the identity)."""

    def __init__(self, shape, text_dim: int, channels=(32, 32, 64, 64)):
        super().__init__()
        c, h, w = (int(v) for v in shape)
        self.shape = (c, h, w)
        self.convs, self.norms, self.films = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for out in channels:
            self.convs.append(nn.Conv2d(c, out, 3, stride=2, padding=1))
            self.norms.append(nn.GroupNorm(8, out))
            film = nn.Linear(text_dim, 2 * out)
            nn.init.zeros_(film.weight)
            nn.init.zeros_(film.bias)
            self.films.append(film)
            c = out
        self.out_dim = c

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        x = image.reshape(image.shape[0], *self.shape)
        for conv, norm, film in zip(self.convs, self.norms, self.films):
            gamma, beta = film(text).chunk(2, dim=-1)
            x = norm(conv(x)) * (1.0 + gamma[:, :, None, None]) + beta[:, :, None, None]
            x = nn.functional.silu(x)
        return x.mean(dim=(2, 3))


class TinyViT(nn.Module):
    """``[B, C*H*W]`` image and ``[B, T]`` text -> ``[B, dim]``: patch embedding, a learned position embedding, the
    projected text as one more token and a class token, pre-norm transformer layers; the class token's output."""

    def __init__(self, shape, text_dim: int, patch: int = 8, dim: int = 128, depth: int = 4, heads: int = 4):
        super().__init__()
        c, h, w = (int(v) for v in shape)
        if h % patch or w % patch:
            raise ValueError(f"image {h}x{w} is not a multiple of the patch size {patch}")
        self.shape = (c, h, w)
        self.patch = nn.Conv2d(c, dim, patch, stride=patch)
        n = (h // patch) * (w // patch)
        self.pos = nn.Parameter(torch.randn(1, n + 2, dim) * 0.02)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.text = nn.Linear(text_dim, dim)
        self.blocks = _transformer(dim, depth, heads)
        self.norm = nn.LayerNorm(dim)
        self.out_dim = dim

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        b = image.shape[0]
        x = self.patch(image.reshape(b, *self.shape)).flatten(2).transpose(1, 2)  # [B, n, dim]
        x = torch.cat([self.cls.expand(b, -1, -1), self.text(text)[:, None], x], 1) + self.pos
        return self.norm(self.blocks(x)[:, 0])


class TermTokens(nn.Module):
    """The state as a set of tokens, one per observation term, and the instruction as one more; pre-norm transformer
    layers over them; the instruction token's output. Terms of one kind (``kinds``: the same size, unit, frame and
    description, e.g. each cube's pose) share one encoder and differ by a learned identity embedding: a skill
    learned on one object carries to the others, and attention lets the instruction pick the object it names.
    ``terms``: ``[start, size]`` of each term in the state vector."""

    def __init__(self, terms: list, kinds: list, text_dim: int, dim: int = 64, depth: int = 2, heads: int = 4):
        super().__init__()
        self.terms = [(int(a), int(b)) for a, b in terms]
        self.kinds = [int(k) for k in kinds]
        sizes = {}
        for (_, size), kind in zip(self.terms, self.kinds):
            if sizes.setdefault(kind, size) != size:
                raise ValueError(f"terms of kind {kind} differ in size ({sizes[kind]} and {size})")
        self.encoders = nn.ModuleList(nn.Linear(sizes[k], dim) for k in range(max(self.kinds) + 1))
        # per kind, the state entries of its terms ``[n_terms, size]`` (one matmul per kind), and the token order
        for k in range(len(self.encoders)):
            idx = [list(range(a, a + n)) for (a, n), kind in zip(self.terms, self.kinds) if kind == k]
            self.register_buffer(f"entries{k}", torch.tensor(idx, dtype=torch.long), persistent=False)
        order = [i for k in range(len(self.encoders)) for i, kind in enumerate(self.kinds) if kind == k]
        self.register_buffer("order", torch.tensor(order, dtype=torch.long).argsort(), persistent=False)
        self.text = nn.Linear(text_dim, dim)
        self.identity = nn.Parameter(torch.randn(1, len(self.terms) + 1, dim) * 0.02)
        self.blocks = _transformer(dim, depth, heads)
        self.norm = nn.LayerNorm(dim)
        self.out_dim = dim

    def forward(self, state: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        by_kind = [enc(state[:, getattr(self, f"entries{k}")]) for k, enc in enumerate(self.encoders)]
        x = torch.cat([self.text(text)[:, None], torch.cat(by_kind, 1)[:, self.order]], 1) + self.identity
        return self.norm(self.blocks(x)[:, 0])


class EntityPointers(nn.Module):
    """Pointers into the scene's objects, keyed by the instruction: the state terms of a kind that occurs more than
    once (each cube's pose, each surface's) are entities; ``pointers`` attention heads each form a query from the
    instruction alone, score every entity by ``q . k_i / sqrt(dim)`` (``k_i`` a linear map of the entity's own
    entries plus a learned identity per entity: its colour, which surface) and return the softmax mixture of the
    entities' values (a linear map of their entries). A sharp head hands the trunk one object's entries, wherever it
    stands in the observation: the skill that moves toward "the target" and "the goal" is shared by every task and
    every object, and only the choice of object is learned per instruction (a colour through the identity, a place
    such as "leftmost" through the key's linear map of the position). A query that also read the arm's state picked
    the instructed cube at 77% of fresh spatial starts (92% from the instruction alone; 10-demo mini-libero clone,
    seed 0: 62% -> 70%). ``query_gain`` multiplies the instruction the query reads, and with it how far each step of
    the query's weights moves the scores (Adam's steps are per weight): two instructions as alike as "leftmost" and
    "rightmost" (MiniLM cosine 0.99) come apart within the same cloning budget. ``terms``: ``[start, size]`` of each
    state term; ``kinds`` as in ``TermTokens``."""

    def __init__(self, terms: list, kinds: list, text_dim: int, pointers: int = 2, dim: int = 64,
                 query_gain: float = 1.0, hard: bool = False):
        super().__init__()
        terms = [(int(a), int(b)) for a, b in terms]
        kinds = [int(k) for k in kinds]
        groups = [k for k in sorted(set(kinds)) if kinds.count(k) > 1]
        if not groups:
            raise ValueError("no kind of state term occurs more than once: there are no entities to point at")
        # the state entries outside the entities (proprioception): what the trunk may read directly
        context = [a + j for (a, n), kind in zip(terms, kinds) if kind not in groups for j in range(n)]
        self.register_buffer("context_idx", torch.tensor(context, dtype=torch.long), persistent=False)
        self.keys, self.values = nn.ModuleList(), nn.ModuleList()
        self.sizes: list[int] = []  # entries per entity, per kind
        for k in groups:
            idx = [list(range(a, a + n)) for (a, n), kind in zip(terms, kinds) if kind == k]
            self.register_buffer(f"entries{len(self.keys)}", torch.tensor(idx, dtype=torch.long), persistent=False)
            self.sizes.append(len(idx[0]))
            self.keys.append(nn.Linear(len(idx[0]), dim))
            self.values.append(nn.Linear(len(idx[0]), dim))
        count = sum(kinds.count(k) for k in groups)
        self.identity = nn.Parameter(torch.randn(1, count, dim) * 0.1)
        self.query = nn.Linear(text_dim, pointers * dim)
        self.pointers, self.dim = pointers, dim
        self.out_dim = pointers * dim
        self.query_gain = float(query_gain)
        self.hard = bool(hard)

    def weigh(self, logits: torch.Tensor) -> torch.Tensor:
        """The pointers' weights over the entities from their scores: the softmax, or with ``hard`` its argmax as a
        one-hot (the trunk is handed exactly one object's entries) whose gradient is the softmax's (straight-through:
        Bengio et al. 2013)."""
        soft = torch.softmax(logits, -1)
        if not self.hard:
            return soft
        one_hot = nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(soft.dtype)
        return one_hot + (soft - soft.detach())

    def _parts(self, state: torch.Tensor) -> list[torch.Tensor]:
        """Per kind of entity, its entities' entries ``[B, entities of the kind, size]``."""
        return [state[:, getattr(self, f"entries{i}")] for i in range(len(self.keys))]

    def entities(self, state: torch.Tensor) -> torch.Tensor:
        """``[B, entities, 3]``: the first three entries of each entity (a pose term's position)."""
        return torch.cat([p[..., :3] for p in self._parts(state)], 1)

    def padded_entries(self, state: torch.Tensor) -> torch.Tensor:
        """``[B, entities, width]``: every entity's entries in ``attention``'s order, zero-padded to the widest kind."""
        width = max(self.sizes)
        return torch.cat([nn.functional.pad(p, (0, width - n)) for p, n in zip(self._parts(state), self.sizes)], 1)

    def attention(self, state: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, pointers, entities]`` logits and ``[B, entities, dim]`` values."""
        parts = self._parts(state)
        keys = torch.cat([k(p) for k, p in zip(self.keys, parts)], 1) + self.identity
        values = torch.cat([v(p) for v, p in zip(self.values, parts)], 1)
        q = self.query(text * self.query_gain).view(-1, self.pointers, self.dim)
        return q @ keys.transpose(1, 2) / math.sqrt(self.dim), values

    def pick(self, state: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, pointers * dim]``: what the pointers hand over; and their attention ``[B, pointers, entities]``."""
        logits, values = self.attention(state, text)
        weights = self.weigh(logits)
        return (weights @ values).flatten(1), weights

    def forward(self, state: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.pick(state, text)[0]


class VLAPolicy(ChunkQueue, nn.Module):
    spec_name = "vla"

    def __init__(self, obs_dim: int, act_dim: int, text: list, image: list | None = None, vision: str = "cnn",
                 width: int = 256, head: str = "tokens", bins: int = 256, chunk: int = 4, execute: int = 1,
                 obs_normalization: bool = True, low: list | None = None, high: list | None = None,
                 terms: list | None = None, state_encoder: str = "tokens", query_gain: float = 1.0,
                 relation: bool = False, hard_pointers: bool = False, text_features: int = TEXT_FEATURES):
        super().__init__()
        if head not in ("tokens", "continuous"):
            raise ValueError(f"head must be tokens or continuous, got {head!r}")
        if vision not in ("cnn", "vit"):
            raise ValueError(f"vision must be cnn or vit, got {vision!r}")
        if not 1 <= execute <= chunk:
            raise ValueError(f"execute must be in 1..chunk, got {execute} of {chunk}")
        self.init_kwargs = dict(obs_dim=obs_dim, act_dim=act_dim, text=list(text), image=image, vision=vision,
                                width=width, head=head, bins=bins, chunk=chunk, execute=execute,
                                obs_normalization=obs_normalization, low=low, high=high, terms=terms,
                                state_encoder=state_encoder, query_gain=query_gain, relation=relation,
                                hard_pointers=hard_pointers, text_features=text_features)
        self.act_dim, self.horizon, self.execute, self.bins, self.head = act_dim, chunk, execute, bins, head
        keep = self._inputs(obs_dim, text, image, vision)
        state_dim = int(keep.sum())
        self.normalizer = EmpiricalNormalizer(state_dim) if obs_normalization else nn.Identity()
        t_len = int(text[1])
        self._state_encoder(keep, t_len, terms, state_encoder, query_gain, relation, hard_pointers)
        # with pointers the rest of the state reaches the trunk only through them: the objects' entries come as the
        # ones the instruction picks, so nothing can tie an action to where an unnamed object stands
        direct = len(self.context_idx) if self.pointers is not None else state_dim
        self.state_net = nn.Sequential(nn.Linear(direct, STATE_FEATURES), nn.SiLU())
        if text_features < 0:
            raise ValueError(f"text_features >= 0, got {text_features}")
        if text_features == 0 and self.pointers is None:
            raise ValueError("text_features 0 (the trunk reads no instruction) needs entity pointers to carry it")
        # text_features 0: the instruction reaches the trunk only through what the pointers pick
        self.text_net = nn.Linear(t_len, text_features) if text_features > 0 else None
        feat = STATE_FEATURES + text_features + (self.vision.out_dim if image else 0) + \
            (self.tokens.out_dim if self.tokens is not None else 0) + \
            (self.pointers.out_dim if self.pointers is not None else 0) + (3 if self.relation else 0)
        self.trunk = nn.Sequential(nn.Linear(feat, width), nn.LayerNorm(width), nn.SiLU(), nn.Linear(width, width),
                                   nn.SiLU())
        self._heads(width, head, chunk, act_dim, bins)
        # the tokenizer's range (percentiles of the dataset's actions), set by ``fit_action_range``
        self.register_buffer("low", torch.tensor(low if low is not None else [-1.0] * act_dim, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(high if high is not None else [1.0] * act_dim,
                                                  dtype=torch.float32))

    def _inputs(self, obs_dim: int, text: list, image: list | None, vision: str) -> torch.Tensor:
        """The observation's text and image slices (and the vision encoder); returns the mask of its state entries."""
        t0, t_len = int(text[0]), int(text[1])
        keep = torch.ones(obs_dim, dtype=torch.bool)
        keep[t0:t0 + t_len] = False
        self.text_slice = slice(t0, t0 + t_len)
        self.image_slice = None
        if image:
            i0, shape = int(image[0]), tuple(int(v) for v in image[1:])
            self.image_slice = slice(i0, i0 + math.prod(shape))
            keep[self.image_slice] = False
            self.vision = FiLMConvEncoder(shape, t_len) if vision == "cnn" else TinyViT(shape, t_len)
        self.register_buffer("state_idx", keep.nonzero().squeeze(-1), persistent=False)
        return keep

    def _state_encoder(self, keep: torch.Tensor, t_len: int, terms: list | None, state_encoder: str,
                       query_gain: float, relation: bool, hard_pointers: bool) -> None:
        """The term-token or entity-pointer encoder of the state terms (``terms``: [obs start, size, kind] each)."""
        self.tokens = self.pointers = None
        if terms:
            position = torch.cumsum(keep.long(), 0) - 1  # an observation entry's place in the state vector
            at = [[int(position[int(a)]), int(n)] for a, n, _ in terms]
            kinds = [int(k) for _, _, k in terms]
            if state_encoder == "tokens":
                self.tokens = TermTokens(at, kinds, t_len)
            elif state_encoder == "pointers":
                self.pointers = EntityPointers(at, kinds, t_len, query_gain=query_gain, hard=hard_pointers)
            else:
                raise ValueError(f"state_encoder must be tokens or pointers, got {state_encoder!r}")
        if relation and self.pointers is None:
            raise ValueError("relation needs entity pointers (state_encoder=pointers)")
        if hard_pointers and self.pointers is None:
            raise ValueError("hard_pointers needs entity pointers (state_encoder=pointers)")
        self.relation = bool(relation)

    def _heads(self, width: int, head: str, chunk: int, act_dim: int, bins: int) -> None:
        """The action head (256-bin tokens or a Gaussian chunk) and the value head."""
        if head == "tokens":
            self.action_head = nn.Linear(width, chunk * act_dim * bins)
            nn.init.zeros_(self.action_head.bias)
            nn.init.orthogonal_(self.action_head.weight, gain=0.01)
        else:
            self.action_head = nn.Linear(width, chunk * act_dim)
            self.log_std = nn.Parameter(torch.full((act_dim,), -1.0))
        self.value_head = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 1))

    # ---- pieces ----------------------------------------------------------------------------------
    def split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        image = obs[:, self.image_slice] if self.image_slice is not None else None
        return obs.index_select(1, self.state_idx), obs[:, self.text_slice], image

    def normalizer_input(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.index_select(1, self.state_idx)

    @property
    def context_idx(self) -> torch.Tensor:
        """With pointers: the state entries the trunk reads directly (those outside the entities)."""
        return self.pointers.context_idx

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        raw, text, image = self.split(obs)
        state = self.normalizer(raw)
        if self.pointers is not None:
            context = state[:, self.context_idx]
            picked, weights = self.pointers.pick(state, text)
            parts = [self.state_net(context), picked]
            if self.text_net is not None:
                parts.insert(1, self.text_net(text))
            if self.relation:  # where the second pointer's object stands from the first's, in RELATION_SCALE units
                at = weights[:, :2] @ self.pointers.entities(raw)
                parts.append((at[:, 1] - at[:, 0]) / RELATION_SCALE)
        else:
            parts = [self.state_net(state), self.text_net(text)]
        if self.tokens is not None:
            parts.append(self.tokens(state, text))
        if image is not None:
            parts.append(self.vision(image, text))
        return self.trunk(torch.cat(parts, 1))

    def pointer_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, pointers, entities]``: the entity pointers' scores (``state_encoder=pointers``)."""
        state, text, _ = self.split(obs)
        state = self.normalizer(state)
        return self.pointers.attention(state, text)[0]

    def grounded(self, obs: torch.Tensor) -> torch.Tensor:
        """The scene as the instruction names it, in plain state units: the state entries outside the entities (the
        proprioception), then for each of the first two pointers (what to move, where it goes) the mixture of the
        entities' raw entries under its attention (``EntityPointers.padded_entries``; a sharp pointer: that object's
        entries). What a learner that cannot read instructions (a residual MLP) needs to act on the named objects."""
        if self.pointers is None:
            raise ValueError("grounded needs entity pointers (state_encoder=pointers)")
        raw, text, _ = self.split(obs)
        weights = self.pointers.weigh(self.pointers.attention(self.normalizer(raw), text)[0][:, :2])
        return torch.cat([raw[:, self.context_idx], (weights @ self.pointers.padded_entries(raw)).flatten(1)], 1)

    def fit_action_range(self, actions: torch.Tensor, quantile: float = 0.01) -> None:
        """Percentile normalization of the token head from a dataset's actions ``[..., act_dim]`` (OpenVLA's)."""
        from embodied.vla.tokenizer import ActionTokenizer

        tok = ActionTokenizer.fit(actions.cpu(), self.bins, quantile)
        self.low.copy_(tok.low)
        self.high.copy_(tok.high)
        self.init_kwargs.update(low=tok.low.tolist(), high=tok.high.tolist())

    def tokenizer(self):
        from embodied.vla.tokenizer import ActionTokenizer

        return ActionTokenizer(self.low.cpu(), self.high.cpu(), self.bins)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, chunk, act_dim, bins]`` from trunk features."""
        return self.action_head(h).view(-1, self.horizon, self.act_dim, self.bins)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bins -> actions (the bin's centre, un-normalized), in torch ops that export."""
        return decode_bins(tokens, self.low, self.high, self.bins)

    def encode(self, action: torch.Tensor) -> torch.Tensor:
        return encode_bins(action, self.low, self.high, self.bins)

    def bin_position(self, action: torch.Tensor) -> torch.Tensor:
        """Where ``action`` lies on the bin axis, continuously (bin ``k``'s centre is at ``k``)."""
        return bin_position(action, self.low, self.high, self.bins)

    @property
    def action_quantum(self) -> torch.Tensor | None:
        """``[act_dim]``: one bin in action units (token head), or None (continuous head)."""
        return (self.high - self.low) / self.bins if self.head == "tokens" else None

    # ---- the deterministic, exportable path -------------------------------------------------------
    def chunk(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, chunk, act_dim]``: the most likely bins (or the mean), as actions in [-1, 1]."""
        h = self.features(obs)
        if self.head == "tokens":
            return self.decode(self.logits(h).argmax(-1)).clamp(-1.0, 1.0)
        return torch.tanh(self.action_head(h)).view(-1, self.horizon, self.act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The first action of the deterministic chunk (what an exported policy runs every step)."""
        return self.chunk(obs)[:, 0]

    # ---- learning ----------------------------------------------------------------------------------
    def bc_loss(self, obs: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                label_sigma: float = 0.0, text_noise: float = 0.0, generator: torch.Generator | None = None,
                std_temperature: float = 1.0) -> torch.Tensor:
        """Behaviour cloning on a target chunk ``[B, chunk, act_dim]``: cross-entropy on its bins (tokens), or the
        Gaussian negative log-likelihood of the chunk (continuous). ``label_sigma`` > 0 [bins] spreads each target
        over its neighbouring bins (a discretized Gaussian around the action's exact position): a demonstration's
        action noise spans many bins, and a one-hot target over-fits it. ``text_noise`` > 0 perturbs each
        instruction embedding by Gaussian noise of that std per entry (then back to unit length): a policy that saw
        two phrasings per task otherwise keys on their exact embeddings and ignores a paraphrase.
        ``std_temperature`` T (continuous head) weights the likelihood's log-std term by T^2, so the std settles at the
        targets' spread divided by T: the policy sampled at temperature T (std x T) matches them, with the mean's
        term, and so its gradient, as at T = 1 (the plain likelihood)."""
        if text_noise > 0:
            t = obs[:, self.text_slice]
            t = t + text_noise * torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype)
            obs = torch.cat([obs[:, :self.text_slice.start], t / t.norm(dim=1, keepdim=True).clamp_min(1e-6),
                             obs[:, self.text_slice.stop:]], 1)
        h = self.features(obs)
        if self.head == "tokens":
            logits = self.logits(h).reshape(-1, self.bins)
            if label_sigma <= 0:
                return nn.functional.cross_entropy(logits, self.encode(target).reshape(-1),
                                                   label_smoothing=label_smoothing)
            return soft_bin_cross_entropy(logits, self.bin_position(target).reshape(-1), label_sigma,
                                          label_smoothing)
        mean = torch.tanh(self.action_head(h)).view(-1, self.horizon, self.act_dim)
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        return (0.5 * ((target - mean) / log_std.exp()) ** 2 + std_temperature ** 2 * log_std).mean()

    def dist(self, obs: torch.Tensor, temperature: float = 1.0):
        """The distribution of the chunk's first action (RL): independent categoricals over each dimension's bins
        (``log_prob`` takes actions, encoded to their bins), or a diagonal Gaussian."""
        return self.dist_from(self.features(obs), temperature)

    def dist_from(self, h: torch.Tensor, temperature: float = 1.0):
        if self.head == "tokens":
            return BinnedActions(self, self.logits(h)[:, 0] / temperature)
        mean = torch.tanh(self.action_head(h)).view(-1, self.horizon, self.act_dim)[:, 0]
        std = (self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp() * temperature).expand_as(mean)
        return torch.distributions.Normal(mean, std)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.features(obs)).squeeze(-1)


def soft_bin_cross_entropy(logits: torch.Tensor, position: torch.Tensor, sigma: float,
                           smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of ``logits [M, bins]`` against a discretized Gaussian of std ``sigma`` [bins] centred at
    ``position [M]`` (mixed with a uniform by ``smoothing``), averaged over ``M``."""
    bins = torch.arange(logits.shape[-1], device=logits.device, dtype=logits.dtype)
    target = torch.softmax(-0.5 * ((bins - position[:, None]) / sigma) ** 2, -1)
    if smoothing > 0:
        target = (1.0 - smoothing) * target + smoothing / logits.shape[-1]
    return -(target * torch.log_softmax(logits, -1)).sum(-1).mean()


class BinnedActions(MultiCategorical):
    """Independent categoricals over each action dimension's bins whose samples and log-probabilities are in
    action units: ``sample`` decodes the drawn bins, ``log_prob(action)`` encodes the action to its bins first
    (a decoded bin centre encodes back to its bin exactly)."""

    def __init__(self, policy: VLAPolicy, logits: torch.Tensor):  # logits [B, act_dim, bins]
        self.policy, self.logits = policy, logits
        self.log_p = torch.log_softmax(logits, -1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return self.log_p.gather(-1, self.policy.encode(action)[..., None]).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.log_p.exp() * self.log_p).sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        b, d, k = self.log_p.shape
        idx = torch.multinomial(self.log_p.exp().reshape(b * d, k), 1, generator=generator).view(b, d)
        return self.policy.decode(idx)

    @property
    def mode(self) -> torch.Tensor:
        return self.policy.decode(self.logits.argmax(-1))


def describe(policy: VLAPolicy, batch_sizes=(1, 64), repeats: int = 20) -> dict:
    """Parameter count and the forward latency [ms] of ``policy`` (median of ``repeats``) at each batch size."""
    import time

    obs_dim = policy.init_kwargs["obs_dim"]
    out = {"parameters": sum(p.numel() for p in policy.parameters())}
    with torch.no_grad():
        for b in batch_sizes:
            x = torch.rand(b, obs_dim)
            policy.chunk(x)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                policy.chunk(x)
                times.append(time.perf_counter() - t)
            out[f"forward_ms_b{b}"] = round(1e3 * sorted(times)[len(times) // 2], 3)
    return out


POLICIES.register("vla", VLAPolicy)
