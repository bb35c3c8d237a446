"""Software-in-the-loop vehicles: our simulator behind a real autopilot protocol (MAVLink; CRTP for cflib)."""

from __future__ import annotations

import time


def parse_factors(text: str) -> dict[str, float]:
    """``"mass=1.2,thrust=0.9"`` -> plant factors."""
    return {k: float(v) for k, v in (kv.split("=", 1) for kv in text.split(",") if kv)}


def serve(vehicle, banner: str) -> None:
    """Run a vehicle until Ctrl-C (the ``python -m embodied.hardware.sitl.<protocol>`` entry points)."""
    with vehicle:
        print(banner + "; Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
