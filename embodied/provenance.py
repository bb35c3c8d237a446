"""Where a run or an artifact came from: the code's commit, package versions."""

from __future__ import annotations

import subprocess
from pathlib import Path


def code_commit() -> str | None:
    """The git commit of the checkout this package runs from (``-dirty`` with uncommitted changes), or
    None outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions(*packages: str) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("embodied", *packages):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out
