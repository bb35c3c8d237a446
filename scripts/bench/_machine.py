"""What every benchmark JSON records about the machine and the libraries that produced it."""

from __future__ import annotations

import os
import platform


def machine_info() -> dict:
    import mujoco
    import torch

    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "mujoco": mujoco.__version__, "torch": torch.__version__}


def emit(result: dict, out: str | None) -> None:
    """Print a benchmark's JSON on stdout and, with ``out``, write it there too."""
    import json
    from pathlib import Path

    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
