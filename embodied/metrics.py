"""Run-directory logging: ``metrics.jsonl``, TensorBoard events, a live progress line, and a
learning-curve PNG."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import yaml


def _scalar(v) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def _process_age() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0, i.e. from the logger's creation)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class MetricsLogger:
    def __init__(self, run_dir: Path, tensorboard: bool, progress: bool, total_steps: int):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.total_steps = total_steps
        self.progress = progress
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tb"))
        self._file = open(self.path, "a", buffering=1)  # line-buffered: a killed run keeps its lines
        self._last_print = 0.0
        self._t0 = time.monotonic() - _process_age()  # time/wall_s on every row: seconds since the command started

    def rewind(self, step: int) -> None:
        """Continue a resumed run's logs from its checkpoint at ``step``: rows logged after it (by the
        process that was killed) are dropped from ``metrics.jsonl`` and purged from TensorBoard, so the
        step column never goes backwards."""
        self._file.close()
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", buffering=1)
        if self.writer is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer.close()
            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=step + 1)

    def log(self, step: int, metrics: dict) -> dict[str, float]:
        row = {k: _scalar(v) for k, v in metrics.items()}
        row.setdefault("time/wall_s", time.monotonic() - self._t0)
        row = {k: v for k, v in row.items() if math.isfinite(v)}
        self._file.write(json.dumps({"step": step, **row}) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                self.writer.add_scalar(k, v, step)
        return row

    def due(self, force: bool = False) -> bool:
        """Whether ``show`` would print now: a terminal gets one rewritten line twice a second, a log file a new
        line every 10 s (callers skip computing what a skipped line would show)."""
        every = 0.5 if sys.stderr.isatty() else 10.0
        return self.progress and (force or time.monotonic() - self._last_print >= every)

    def show(self, step: int, sps: float, ret: float | None, success: float | None, force: bool = False) -> None:
        """Live progress: steps/s, return, success, ETA (one rewritten line on a terminal)."""
        if not self.due(force):
            return
        self._last_print = time.monotonic()
        eta = (self.total_steps - step) / sps if sps > 0 else float("inf")
        parts = [f"step {step:>9,}/{self.total_steps:,}", f"{sps:,.0f} steps/s"]
        if ret is not None:
            parts.append(f"return {ret:8.2f}")
        if success is not None:
            parts.append(f"success {100 * success:5.1f}%")
        parts.append(f"ETA {eta:5.0f}s" if math.isfinite(eta) else "ETA ?")
        end = "\r" if sys.stderr.isatty() and not force else "\n"
        print(" | ".join(parts), end=end, file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """A line of its own among the progress output (below the rewritten line on a terminal)."""
        if self.progress:
            print(("\n" if sys.stderr.isatty() else "") + text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self._file.close()


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics file; a torn last line (killed writer) is skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def plot_learning_curve(run_dir: Path) -> Path | None:
    """``learning_curve.png``: training return and eval return/success against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    if not rows:
        return None
    series = {}
    for key in ("train/return", "eval/return", "eval/success"):
        pts = {r["step"]: r[key] for r in rows if key in r}  # last value wins after a resume
        if pts:
            series[key] = sorted(pts.items())
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("train/return", "eval/return"):
        if key in series:
            xs, ys = zip(*series[key])
            ax.plot(xs, ys, label=key, marker="o" if key.startswith("eval") else None)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    if "eval/success" in series:
        ax2 = ax.twinx()
        xs, ys = zip(*series["eval/success"])
        ax2.plot(xs, [100 * y for y in ys], color="tab:green", linestyle="--", label="eval/success")
        ax2.set_ylabel("eval success [%]")
        ax2.set_ylim(-5, 105)
    ax.legend(loc="upper left")
    config = Path(run_dir) / "config.yaml"  # the task's name, also for a run outside runs/<task>/
    task = yaml.safe_load(config.read_text()).get("task") if config.exists() else Path(run_dir).parent.name
    ax.set_title(f"{task} ({Path(run_dir).name})")
    fig.tight_layout()
    out = Path(run_dir) / "learning_curve.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
