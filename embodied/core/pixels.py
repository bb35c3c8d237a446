"""Camera entries of an observation held as the uint8 pixels they were made from.

A camera renders uint8 RGB and the task hands the policy floats ``u8 * (1/255)`` (``pixels_to_float``; its image
term says so with ``Term.quantized``). What stores many observations (a demonstration dataset, GRPO's rollouts)
keeps those entries as uint8, 4x less memory and disk than float32 (a 2-camera 64x64 observation: 24.6 KB against
98 KB), and the rest as float32; ``unpack(pack(x))`` is ``x`` bit for bit.

    packer = PixelPacker.of(layout, "policy", dim)
    parts = packer.pack(obs)        # {"obs": float32 [..., rest], "obs_pixels": uint8 [..., pixels]}
    obs = packer.unpack(parts)      # float32 [..., dim], the same floats
    rows = packer.unpack_rows(parts, idx)  # rows idx of them, as floats

Without quantized image terms ``pack`` is ``{"obs": x}`` and ``unpack`` gives it back: callers need no branch."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import torch

TO_FLOAT = 1.0 / 255.0


def pixels_to_float(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels as the floats a policy sees, ``u8 * (1/255)`` in float32: the one conversion, so that what a
    store gives back equals what the task produced."""
    return pixels.float().mul(TO_FLOAT)


def _complement(dim: int, parts: Sequence[slice]) -> list[slice]:
    out, at = [], 0
    for s in parts:
        if s.start > at:
            out.append(slice(at, s.start))
        at = s.stop
    if at < dim:
        out.append(slice(at, dim))
    return out


class PixelPacker:
    def __init__(self, dim: int, pixels: Sequence[slice] = ()):
        self.dim = int(dim)
        self.pixels = sorted((slice(int(s.start), int(s.stop)) for s in pixels), key=lambda s: s.start)
        for a, b in zip(self.pixels, self.pixels[1:]):
            if b.start < a.stop:
                raise ValueError(f"pixel ranges overlap: {a} and {b}")
        if self.pixels and (self.pixels[0].start < 0 or self.pixels[-1].stop > self.dim):
            raise ValueError(f"pixel ranges {self.pixels} do not fit {self.dim} entries")
        self.rest = _complement(self.dim, self.pixels)

    @classmethod
    def of(cls, layout, group: str, dim: int) -> PixelPacker:
        """The packer of ``group``'s quantized image terms in ``layout`` (none: a packer that packs nothing)."""
        if layout is None or group not in layout.observation:
            return cls(dim)
        slices = layout.slices(group)
        return cls(dim, [slices[t.name] for t in layout.terms(group) if t.shape and t.quantized])

    @property
    def packs(self) -> bool:
        return bool(self.pixels)

    def pack(self, x: torch.Tensor, key: str = "obs") -> dict[str, torch.Tensor]:
        if not self.pixels:
            return {key: x}
        rest = torch.cat([x[..., s] for s in self.rest], -1) if self.rest else x[..., :0]
        pixels = torch.cat([x[..., s] for s in self.pixels], -1).mul(255.0).round_().to(torch.uint8)
        return {key: rest, f"{key}_pixels": pixels}

    def unpack(self, parts: Mapping[str, torch.Tensor], key: str = "obs") -> torch.Tensor:
        if not self.pixels:
            return parts[key]
        rest, pixels = parts[key], parts[f"{key}_pixels"]
        out = torch.empty(*rest.shape[:-1], self.dim, dtype=torch.float32, device=rest.device)
        for ranges, src, convert in ((self.rest, rest, lambda v: v), (self.pixels, pixels, pixels_to_float)):
            at = 0
            for s in ranges:
                n = s.stop - s.start
                out[..., s] = convert(src[..., at:at + n])
                at += n
        return out

    def unpack_rows(self, parts: Mapping[str, torch.Tensor], idx: torch.Tensor, key: str = "obs") -> torch.Tensor:
        """Rows ``idx`` of packed ``parts`` (which may hold other columns besides this packer's), as floats."""
        names = (key, f"{key}_pixels") if self.pixels else (key,)
        return self.unpack({k: parts[k][idx] for k in names}, key)

    # ---- a dataset's record of it ---------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"dim": self.dim, "pixels": [[s.start, s.stop] for s in self.pixels]})

    @classmethod
    def from_json(cls, text: str) -> PixelPacker:
        d = json.loads(text)
        return cls(d["dim"], [slice(a, b) for a, b in d["pixels"]])
