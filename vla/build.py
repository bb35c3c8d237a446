"""The VLA policy of a run (``policy.arch=vla``), from the task's layout: its instruction term and image term."""

from __future__ import annotations

import sys

from embodied.core.errors import UserError
from embodied.vla.model import VLAPolicy, describe


def instruction_term(layout, group: str = "policy") -> list[int] | None:
    """``[start, size]`` of the group's instruction term (``source="instruction"``), or None."""
    if layout is None or group not in layout.observation:
        return None
    slices = layout.slices(group)
    for t in layout.terms(group):
        if t.source == "instruction":
            return [slices[t.name].start, t.size]
    return None


def state_terms(layout, group: str = "policy") -> list[list[int]]:
    """``[start, size, kind]`` of each state term of the group (not the instruction, not an image), ``kind`` the
    same for terms of the same size, unit, frame and description (one object's pose and another's)."""
    slices, kinds, out = layout.slices(group), {}, []
    for t in layout.terms(group):
        if t.source == "instruction" or t.shape:
            continue
        kind = kinds.setdefault((t.size, t.unit, t.frame, t.description), len(kinds))
        out.append([slices[t.name].start, t.size, kind])
    return out


def build_vla(ctx, act_dim: int, announce: bool = True) -> VLAPolicy:
    """A fresh VLA for the run of ``ctx`` (a ``BuildContext``); ``announce`` prints its size and latency."""
    cfg = ctx.policy.vla
    text = instruction_term(ctx.layout)
    if text is None:
        raise UserError("policy.arch=vla needs a language-conditioned task (an instruction term in its policy "
                        "observations), e.g. mini-libero")
    if cfg.state_encoder not in ("mlp", "tokens", "pointers"):
        raise UserError(f"policy.vla.state_encoder is mlp, tokens or pointers, got {cfg.state_encoder!r}")
    if cfg.head not in ("tokens", "continuous") or cfg.vision not in ("cnn", "vit"):
        raise UserError(f"policy.vla: head is tokens|continuous and vision cnn|vit, got {cfg.head!r}, "
                        f"{cfg.vision!r}")
    if not cfg.query_gain > 0:
        raise UserError(f"policy.vla.query_gain scales the pointers' instruction input: > 0, got {cfg.query_gain}")
    if cfg.chunk < 1 or not 1 <= cfg.execute <= cfg.chunk or cfg.bins < 2 or cfg.width < 8:
        raise UserError(f"policy.vla: chunk >= 1, execute in 1..chunk, bins >= 2, width >= 8; got chunk "
                        f"{cfg.chunk}, execute {cfg.execute}, bins {cfg.bins}, width {cfg.width}")
    obs_dim = ctx.obs_space["policy"].shape[0]
    encoder = cfg.state_encoder
    if encoder == "pointers" and ctx.image("policy"):
        print("vla: the objects are in the image (no object terms in the state): state_encoder mlp, not pointers",
              file=sys.stderr)
        encoder = "mlp"
    try:
        policy = VLAPolicy(obs_dim, act_dim, text, ctx.image("policy"), cfg.vision, cfg.width, cfg.head, cfg.bins,
                           cfg.chunk, cfg.execute, ctx.policy.obs_normalization,
                           terms=state_terms(ctx.layout) if encoder != "mlp" else None,
                           state_encoder=encoder if encoder != "mlp" else "tokens", query_gain=cfg.query_gain,
                           relation=cfg.relation and encoder == cfg.state_encoder,  # pixels: no pointers, none
                           hard_pointers=cfg.hard_pointers and encoder == cfg.state_encoder,
                           text_features=cfg.text_features)
    except ValueError as e:
        raise UserError(f"policy.vla: {e}") from None
    if announce:
        d = describe(policy, repeats=5)
        print(f"vla: {d['parameters'] / 1e6:.2f} M parameters ({cfg.vision if ctx.image('policy') else 'state'} "
              f"input, {cfg.head} head, chunk {cfg.chunk}); forward {d['forward_ms_b1']:.2f} ms at batch 1, "
              f"{d['forward_ms_b64']:.2f} ms at batch 64", file=sys.stderr)
        policy.description = d
    return policy
