"""Compiling numba kernels in a child process while this one goes on.

With a cold on-disk cache (a new checkout, an edited kernel) the quadrotor's first ``embodied train`` compiled its
env kernels (~19 s of CPU on a 2-core Intel Xeon) and then TD3's step (~37 s), one after the other, before the
first update. A ``Background`` started where the learner is built compiles the step in a child process beside the
env's compile in this one, so a first run waits for the longer of the two, not their sum. The child writes numba's
own cache files (``cache=True``), which the first call here then loads; a kernel already in the cache starts no
child, and a child that fails costs only the compile the first call does anyway.

    python -m embodied.kernels.background   (the child: reads its pickled jobs from stdin)"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from collections.abc import Sequence

import numba


def cached(dispatcher, sig: tuple) -> bool:
    """Whether ``dispatcher`` holds or finds on disk a compile for the argument types ``sig`` (reads the cache's
    index only). Where numba's cache internals differ from what this reads, True: nothing starts in a child."""
    try:
        if sig in dispatcher.overloads:
            return True
        cache = dispatcher._cache
        return cache._index_key(sig, dispatcher.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001  (private API: fall back to compiling in the foreground)
        return True


class Background:
    """``jobs``: ``(dispatcher, example arguments)`` pairs; those not in the cache compile in one child process.
    ``wait()`` before the first call of any of them. A job a child of this process compiles already is not started
    again: this one waits for that child (tests build many learners before any of them takes a step)."""

    _running: dict[tuple, subprocess.Popen] = {}  # job -> the child compiling it

    def __init__(self, jobs: Sequence[tuple[object, Sequence]]):
        todo, self.others = [], []
        for dispatcher, args in jobs:
            sig = tuple(numba.typeof(a) for a in args)
            job = (dispatcher.py_func.__module__, dispatcher.py_func.__name__, sig)
            other = self._running.get(job)
            if other is not None and other.poll() is None:
                self.others.append(other)
            elif not cached(dispatcher, sig):
                todo.append(job)
        self.names = [name for _, name, _ in todo]
        self.proc: subprocess.Popen | None = None
        if todo:
            self.proc = subprocess.Popen([sys.executable, "-m", "embodied.kernels.background"], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                self.proc.stdin.write(pickle.dumps(todo))
                self.proc.stdin.close()
                self._running.update(dict.fromkeys(todo, self.proc))
            except OSError:  # the child is gone already: compile here as before
                self.proc = None

    def wait(self) -> int | None:
        """Blocks until the children have written the compiles; returns this one's child's exit status (None: it
        started none)."""
        for other in self.others:
            other.wait()
        self.others = []
        if self.proc is None:
            return None
        code = self.proc.wait()
        self.proc = None
        return code


def main() -> None:
    for module, name, sig in pickle.loads(sys.stdin.buffer.read()):
        getattr(importlib.import_module(module), name).compile(sig)


if __name__ == "__main__":
    main()
