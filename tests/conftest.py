"""Session fixtures shared by the test folders."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def minilm(tmp_path_factory):
    """The offline MiniLM instruction encoder, loaded once per session (``HF_HUB_OFFLINE=1``), with the embedding
    cache in a fresh directory that subprocesses of the tests share (``EMBODIED_CACHE``)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["EMBODIED_CACHE"] = str(tmp_path_factory.mktemp("embodied-cache"))
    from embodied.vla import text

    return text._model()
