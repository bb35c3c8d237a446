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


@pytest.fixture(scope="session")
def floors() -> dict[str, float]:
    """``tests/floors.py``'s learning floors (tests/ is not a package: loaded by path)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("floors", Path(__file__).parent / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FLOORS
