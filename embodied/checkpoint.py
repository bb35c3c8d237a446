"""Checkpoints: everything needed to continue exactly (weights, optimizers, normalizers, replay
buffer, curriculum and RNG states, counters), written atomically."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch

from embodied.core.errors import UserError

CKPT_DIR = "checkpoints"
KEEP = 2  # newest checkpoints kept; older ones are removed after a successful write
REQUIRED_KEYS = ("format", "config", "step", "algo", "collector", "policy")


def checkpoint_paths(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / CKPT_DIR
    return sorted(d.glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1])) if d.is_dir() else []


def save_checkpoint(run_dir: Path, step: int, payload: dict) -> Path:
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"ckpt_{step:012d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a kill leaves the previous checkpoint intact
    for old in checkpoint_paths(run_dir)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(run_dir: Path, device: str = "cpu") -> dict:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    paths = checkpoint_paths(run_dir)
    if not paths:
        raise UserError(f"no checkpoint in {run_dir / CKPT_DIR}")
    try:
        ckpt = torch.load(paths[-1], map_location=device, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"corrupt checkpoint {paths[-1]}: {reason}") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise UserError(f"not an embodied checkpoint: {paths[-1]} (missing {', '.join(missing)})")
    return ckpt


def load_policy(run_dir, device: str = "cpu"):
    from embodied.policies import DeterministicPolicy, build_policy

    ckpt = load_checkpoint(Path(run_dir), device=device)
    try:
        actor = build_policy(ckpt["policy"]["spec"])
        actor.load_state_dict(ckpt["policy"]["state"])
    except (KeyError, RuntimeError, TypeError) as e:
        raise UserError(f"checkpoint in {run_dir} has no usable policy: {str(e).splitlines()[0]}") from None
    return DeterministicPolicy(actor.to(device))
