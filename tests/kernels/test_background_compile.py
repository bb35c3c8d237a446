"""Kernels compiled in a child process (embodied/kernels/background.py) land in numba's own cache, which the first
call here then loads instead of compiling."""

from __future__ import annotations

import importlib
import sys

import numba
import numpy as np

from embodied.kernels.background import Background, cached

SOURCE = '''
import numba as nb


@nb.njit(cache=True)
def axpy(a, x, y):
    return a * x + y
'''


def test_a_cold_kernel_compiles_in_a_child_and_loads_from_the_cache(tmp_path, monkeypatch):
    (tmp_path / "bg_kernel_mod.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the child imports the module by name too
    mod = importlib.import_module("bg_kernel_mod")
    try:
        args = (2.0, np.arange(3, dtype=np.float32), np.ones(3, dtype=np.float32))
        sig = tuple(numba.typeof(a) for a in args)
        assert not cached(mod.axpy, sig)
        bg = Background([(mod.axpy, args)])
        assert bg.names == ["axpy"] and bg.proc is not None
        again = Background([(mod.axpy, args)])  # the same job while the child runs: no second child
        assert again.proc is None and (again.others == [bg.proc] or not again.others)
        assert bg.wait() == 0 and again.wait() is None
        assert cached(mod.axpy, sig)
        assert np.array_equal(mod.axpy(*args), [1.0, 3.0, 5.0])
        assert sum(mod.axpy.stats.cache_hits.values()) == 1 and not mod.axpy.stats.cache_misses  # loaded, not built
        assert Background([(mod.axpy, args)]).proc is None  # held now: nothing to start
    finally:
        sys.modules.pop("bg_kernel_mod", None)
