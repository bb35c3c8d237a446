"""Hardware-in-the-loop plumbing: the generated firmware, built from a bundle, running as its own process on
one end of a pseudo-terminal pair; the other end is a real tty device path that the serial driver opens
with pyserial exactly as it would open ``/dev/ttyUSB0``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from embodied.core.errors import UserError


class FirmwareProcess:
    """``with FirmwareProcess(exe) as tty_path:`` the firmware serving on a pty; stopped on exit."""

    def __init__(self, executable: Path):
        self.executable = Path(executable)
        if not self.executable.is_file():
            raise UserError(f"firmware executable not found: {self.executable}")
        self.proc: subprocess.Popen | None = None
        self.path = ""

    def __enter__(self) -> str:
        master, slave = os.openpty()
        self._slave = slave  # held open so the line never hangs up while the host reopens it
        self.path = os.ttyname(slave)
        # the firmware talks through the master side on its stdin/stdout ("-")
        try:
            self.proc = subprocess.Popen([str(self.executable), "-"], stdin=master, stdout=master,
                                         stderr=subprocess.DEVNULL, close_fds=True)
        except OSError as e:
            os.close(slave)
            raise UserError(f"cannot start the firmware {self.executable}: {e.strerror or e}") from None
        finally:
            os.close(master)
        return self.path

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self._slave)


def firmware_for(bundle_dir: Path) -> Path:
    """The bundle's firmware executable, built once (cached beside the bundle under ``build/``)."""
    from embodied.hardware.bundle import read_bundle
    from embodied.hardware.codegen import build_key, source_hash
    from embodied.hardware.firmware import build_firmware

    meta = read_bundle(bundle_dir)
    if "firmware.c" not in meta["files"]:
        raise UserError(f"bundle {bundle_dir} has no firmware; export it with --format c or all")
    d = Path(meta["dir"])
    key = source_hash(*((d / f).read_text() for f in ("firmware.c", "policy.c", "policy.h")), build_key())[:16]
    exe = d / "build" / f"firmware_{key}"
    if not exe.exists():
        tmp = exe.with_name(exe.name + ".tmp")
        try:
            build_firmware(d, tmp)
            tmp.replace(exe)
        except OSError as e:
            raise UserError(f"cannot build the firmware in {d / 'build'}: {e.strerror or e}") from None
    return exe
