"""The kernels' element copies (``kernels/copy_numba.py``): exact values into views, and (slow tier) that no kernel
lowers an array-valued slice assignment, whose shape-error message numba 0.68 compiles at a cost of CPU seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied.kernels.copy_numba import copy1, copy2

ROOT = Path(__file__).resolve().parents[2]


def test_copies_write_views_exactly():
    a = np.zeros((3, 4), dtype=np.float32)
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    copy1(a[1], src[2])  # a row from a row
    copy1(a[:, 0], src[:, 3])  # a strided column
    assert a.tolist() == [[3, 0, 0, 0], [7, 9, 10, 11], [11, 0, 0, 0]]
    b = np.zeros((3, 6), dtype=np.float32)
    copy2(b[:, 2:4], src[:, 1:3])
    assert np.array_equal(b[:, 2:4], src[:, 1:3]) and not b[:, :2].any() and not b[:, 4:].any()


# the probe: a fresh numba cache (every kernel compiles in this process), numba's lowering of slice assignments
# wrapped to record array-valued ones, background compiles kept in-process, the kernel tests run
PROBE = """
import collections, json, sys
import numba.np.arrayobj as A
from numba.core import types
seen = collections.Counter()
lower = A.fancy_setslice
def wrapped(context, builder, sig, args, index_types, indices):
    if isinstance(sig.args[2], types.Buffer):  # the value assigned is an array, not a scalar
        seen[f"{builder.function.name[:100]} <- {sig.args[2]}"] += 1
    return lower(context, builder, sig, args, index_types, indices)
A.fancy_setslice = wrapped
import embodied.kernels.background as B
def in_process(self, jobs):
    self.others, self.proc, self.names = [], None, []
B.Background.__init__ = in_process
import pytest
code = pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not slow", *sys.argv[2:]])
kernels = sorted(seen)
import numba, numpy as np
@numba.njit
def canary(a, b):  # one array-valued slice assignment: the probe must see it
    a[0] = b
canary(np.zeros((2, 3)), np.ones(3))
result = {"code": int(code), "seen": kernels, "canary": sorted(set(seen) - set(kernels))}
open(sys.argv[1], "w").write(json.dumps(result))
"""


@pytest.mark.slow
def test_no_kernel_lowers_an_array_valued_slice_assignment(tmp_path):
    files = [str(p) for p in sorted((ROOT / "tests" / "kernels").glob("test_*.py"))
             if p.name not in ("test_background_compile.py", Path(__file__).name)]
    files.append(str(ROOT / "tests" / "tasks" / "test_quadrotor_fused.py"))
    out = tmp_path / "seen.json"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    subprocess.run([sys.executable, "-c", PROBE, str(out), *files], cwd=ROOT, env=env, check=False, timeout=1800)
    result = json.loads(out.read_text())
    assert result["code"] == 0 and len(result["canary"]) == 1  # the kernel tests passed; the probe sees the canary
    assert result["seen"] == []  # write element copies instead (kernels/copy_numba.py)
