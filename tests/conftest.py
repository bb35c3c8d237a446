"""Session fixtures shared by the test folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# `python -m pytest` (the README's test command) puts the working directory first on sys.path; from the repo root
# its source folder kernels/ (installed as embodied.kernels) then shadows the PyPI package `kernels`, which
# transformers 5.25 requires and imports: `import sentence_transformers` failed with "cannot import name
# 'CUDAProperties' from 'kernels'". The root moves to the end of the path: installed packages first, then `tests.*`.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _ROOT] + [str(_ROOT)]


@pytest.fixture(autouse=True)
def _one_thread_per_worker():
    """Under xdist (the default run: ``-n 2``, one worker per core) every test starts on one torch thread: a worker's
    torch otherwise takes a thread per core until a ``train`` in it sets ``torch_threads`` (1), so which tests ran
    first decided whether two workers ran four threads on two cores (numba keeps its threads: the kernels' tests check
    their parallel paths)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


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
