"""Checkpoints: everything needed to continue exactly (weights, optimizers, normalizers, replay
buffer, curriculum and RNG states, counters), written atomically."""

from __future__ import annotations

import os
import pickle
import sys
import zipfile
from pathlib import Path

import torch

from embodied.core.errors import UserError

CKPT_DIR = "checkpoints"
KEEP = 3  # newest checkpoints kept by default; older ones are removed after a successful write
REQUIRED_KEYS = ("format", "config", "step", "algo", "collector", "policy")


def checkpoint_paths(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / CKPT_DIR
    return sorted(d.glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1])) if d.is_dir() else []


def save_checkpoint(run_dir: Path, step: int, payload: dict, keep: int = KEEP) -> Path:
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"ckpt_{step:012d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a kill leaves the previous checkpoint intact
    for old in checkpoint_paths(run_dir)[:-max(1, keep)]:
        old.unlink(missing_ok=True)
    return path


def _read(path: Path, device: str) -> dict:
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"corrupt checkpoint {path}: {reason}") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise UserError(f"not an embodied checkpoint: {path} (missing {', '.join(missing)})")
    return ckpt


def load_checkpoint(run_dir: Path, device: str = "cpu") -> dict:
    """The newest intact checkpoint of a run; a corrupt newer one is skipped with one line on stderr."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    paths = checkpoint_paths(run_dir)
    if not paths:
        raise UserError(f"no checkpoint in {run_dir / CKPT_DIR}")
    skipped: list[UserError] = []
    for path in reversed(paths):
        try:
            ckpt = _read(path, device)
        except UserError as e:
            skipped.append(e)
            continue
        if skipped:
            more = f" ({len(skipped)} newer ones unreadable)" if len(skipped) > 1 else ""
            print(f"warning: {skipped[0]}; using the previous one, {path.name}{more}", file=sys.stderr)
        return ckpt
    raise skipped[0]


def load_policy(run_dir, device: str = "cpu"):
    return policy_from_checkpoint(load_checkpoint(Path(run_dir), device=device), run_dir, device)


def policy_from_checkpoint(ckpt: dict, run_dir, device: str = "cpu"):
    """The deterministic policy held by an already loaded checkpoint of ``run_dir``."""
    from embodied.policies import DeterministicPolicy, build_policy

    try:
        actor = build_policy(ckpt["policy"]["spec"])
        actor.load_state_dict(ckpt["policy"]["state"])
    except (KeyError, RuntimeError, TypeError) as e:
        raise UserError(f"checkpoint in {run_dir} has no usable policy: {str(e).splitlines()[0]}") from None
    return DeterministicPolicy(actor.to(device))
