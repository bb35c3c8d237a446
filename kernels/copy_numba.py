"""Element copies for the numba kernels, in place of array-valued slice assignments (``a[i] = b``,
``a[:, :k] = b[:, j:j + k]``): numba 0.68 lowers each of those with a formatted shape-mismatch message (its
``str`` / ``join`` / ``repr`` machinery), which costs CPU seconds of every kernel's cold compile (a machine's first
quadrotor run: 108 -> 87 s without them). Called with views (``copy1(out[m], src[j, e])``) they lower to plain loops.
``tests/kernels/test_copy_kernel.py`` checks the values and, in the slow tier, that no kernel lowers such an
assignment again."""

from __future__ import annotations

import numba as nb


@nb.njit(cache=True, inline="always")
def copy1(dst, src):
    """``dst[:] = src`` for 1-D arrays of the same length."""
    for i in range(src.shape[0]):
        dst[i] = src[i]


@nb.njit(cache=True, inline="always")
def copy2(dst, src):
    """``dst[:, :] = src`` for 2-D arrays of the same shape."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]
