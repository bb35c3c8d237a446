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
