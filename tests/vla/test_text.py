"""The frozen instruction encoder: real MiniLM, offline, cached per string on disk."""

from __future__ import annotations

import numpy as np

from embodied.vla import text


def test_embeddings_are_unit_vectors_cached_per_string(minilm, monkeypatch):
    strings = ["pick up the red cube and place it on the plate", "put the red cube on the plate",
               "stack the green cube on the blue cube"]
    first = text.encode(strings)
    assert first.shape == (3, 384) and first.dtype == np.float32
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    assert all((text.cache_dir() / f"{text._key(s)}.npy").exists() for s in strings)
    # the same as the model's own embedding, and from the cache on the next call (the model is not asked)
    direct = minilm.encode(strings[:1], convert_to_numpy=True, normalize_embeddings=True)
    assert np.allclose(first[0], direct[0], atol=1e-5)
    monkeypatch.setattr(text, "_model", lambda: (_ for _ in ()).throw(AssertionError("model loaded")))
    assert np.array_equal(text.encode(strings[::-1]), first[::-1])
    # a paraphrase lies nearer its instruction than another task's does
    sim = first @ first.T
    assert sim[0, 1] > sim[0, 2]


def test_instruction_table_rows(minilm):
    table = text.InstructionTable(["a", "b", "a"])
    assert table.texts == ["a", "b"] and len(table) == 2
    assert np.allclose(table.embed([1, 0]).numpy(), text.encode(["b", "a"]))


def test_exported_text_encoder_matches_minilm(minilm, tmp_path):
    report = text.export_text_encoder(tmp_path / "te")
    assert report["max_abs_error"] < 1e-5
    enc = text.TextEncoder(tmp_path / "te")  # onnxruntime + tokenizers only
    strings = ["put the yellow cube on the tray", "a much longer instruction that a deploy side was never shown"]
    assert np.allclose(enc.encode(strings), text.encode(strings), atol=1e-5)
