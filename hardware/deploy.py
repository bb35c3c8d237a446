"""``embodied deploy``: a bundle flown on a robot by the control loop, with a flight log and its plot."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from embodied.core.errors import UserError
from embodied.core.layout import Layout
from embodied.hardware.bundle import load_bundle
from embodied.hardware.loop import ControlLoop, LoopConfig
from embodied.hardware.robot import make_robot


def check_layouts(bundle: Layout, robot: Layout, uri: str) -> None:
    """The robot reports the terms the policy reads and takes the action it writes (names and sizes, in order)."""
    want = [(t.name, t.size) for t in bundle.robot_terms("policy")]
    have = [(t.name, t.size) for t in robot.robot_terms("policy")]
    if want != have:
        raise UserError(f"the bundle's layout does not match {uri}: the policy reads {want}, the robot reports {have}")
    want_a = [(t.name, t.size) for t in bundle.action]
    have_a = [(t.name, t.size) for t in robot.action]
    if want_a != have_a:
        raise UserError(f"the bundle's action {want_a} does not match {uri}'s {have_a}")


def deploy(bundle_dir: Path, uri: str, duration: float | None = 10.0, rate: float | None = None,
           backend: str = "onnx", log_dir: Path | None = None, lockstep: bool = False,
           instruction: str | None = None, text_encoder: Path | None = None, **loop_kw) -> dict:
    runner = load_bundle(bundle_dir, backend)  # a corrupt bundle: UserError before anything moves
    if runner.instruction_dim or instruction is not None:  # a language-conditioned policy follows this one
        if instruction is None:
            raise UserError("this bundle's policy follows an instruction: give --instruction TEXT (one of: "
                            + "; ".join(runner.instructions[:4]) + ("..." if len(runner.instructions) > 4 else "")
                            + ")")
        encoder = None
        if text_encoder is not None:
            from embodied.vla.text import TextEncoder

            encoder = TextEncoder(text_encoder)
        runner.set_instruction(instruction, encoder)
    safety = loop_kw.get("safety")
    if safety is not None and safety.residual_limit is not None:
        if runner.residual_limit is None:
            raise UserError(f"--residual-limit: the bundle {bundle_dir} is no residual over a base policy")
        if not 0.0 <= safety.residual_limit:
            raise UserError(f"--residual-limit must be >= 0, got {safety.residual_limit}")
    robot = make_robot(uri)
    robot.attach_bundle(Path(bundle_dir))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = (Path(log_dir) if log_dir else Path(bundle_dir) / "flights").resolve()
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the flight log to {log_dir}: {e.strerror or e}") from None
    i, name = 1, f"flight_{stamp}"
    while (log_dir / f"{name}.jsonl").exists():  # two flights in the same second
        name, i = f"flight_{stamp}-{i}", i + 1
    log_path = log_dir / f"{name}.jsonl"
    with robot:
        check_layouts(runner.layout, robot.layout, uri)
        cfg = LoopConfig(rate_hz=rate or runner.layout.control_hz, duration_s=duration, lockstep=lockstep,
                         log_path=log_path, **loop_kw)
        loop = ControlLoop(robot, None if robot.onboard_policy else runner, cfg)
        previous = signal.signal(signal.SIGINT, lambda *_: loop.request_stop("interrupted"))
        try:
            summary = loop.run()
        finally:
            signal.signal(signal.SIGINT, previous)
    summary["log"] = str(log_path)
    summary["plot"] = str(plot_flight(log_path, runner.layout))
    log_path.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return summary


def plot_flight(log_path: Path, layout: Layout) -> Path:
    """Position (or the first robot term), actions and mode over time, as a PNG beside the log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, transitions = [], []
    for line in Path(log_path).read_text().splitlines():
        r = json.loads(line)
        if "tick" in r:
            rows.append(r)
        elif "transition" in r:
            transitions.append(r["transition"])
    out = Path(log_path).with_suffix(".png")
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if rows and "state" in rows[0]:
        t = [r["t"] for r in rows]
        first = layout.robot_terms("policy")[0]
        name = layout.extras.get("position_term", first.name)
        start = 0
        for term in layout.robot_terms("policy"):
            if term.name == name:
                break
            start += term.size
        size = next(term.size for term in layout.robot_terms("policy") if term.name == name)
        for j in range(size):
            axes[0].plot(t, [r["state"][start + j] for r in rows], label=f"{name}[{j}]")
        axes[0].set_ylabel(name)
        axes[0].legend(loc="upper right", fontsize=7)
        applied = [r["applied"] for r in rows if r.get("applied") is not None]
        ta = [r["t"] for r in rows if r.get("applied") is not None]
        for j in range(len(applied[0]) if applied else 0):
            axes[1].plot(ta, [a[j] for a in applied], label=f"action[{j}]", lw=0.8)
        axes[1].set_ylabel("applied action")
        axes[1].legend(loc="upper right", fontsize=7)
        for tr in transitions:
            k = tr["tick"]
            if k < len(rows):
                for ax in axes:
                    ax.axvline(rows[k]["t"], color="grey", lw=0.6, ls="--")
                axes[0].annotate(tr["dst"], (rows[k]["t"], 1.0), xycoords=("data", "axes fraction"), fontsize=7)
    axes[-1].set_xlabel("time [s]")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
