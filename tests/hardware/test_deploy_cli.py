"""``embodied export`` and ``embodied deploy`` as a user runs them: a flight on the simulated robot with its
log and plot, and every bad input as one line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("deploy")
    out = {}
    for task in ("quadrotor-hover", "pendulum"):
        r = cli(["train", "--task", task, "--preset", "debug", "--run-dir", f"run_{task}", "total_steps=256",
                 "log.progress=false"], cwd)
        assert r.returncode == 0, r.stderr[-3000:]
        r = cli(["export", "--run", f"run_{task}", "--format", "onnx", "--out", f"bundle_{task}"], cwd)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["parity"]["passed"]
        out[task] = cwd / f"bundle_{task}"
    return cwd, out


def test_deploy_flies_writes_log_and_plot(bundles):
    cwd, b = bundles
    r = cli(["deploy", "--bundle", str(b["quadrotor-hover"]), "--robot", "sim://quadrotor-hover?mass=1.1",
             "--duration", "0.5", "--log-dir", "flights"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert s["outcome"] == "completed" and s["ticks"] > 40 and Path(s["plot"]).stat().st_size > 0
    assert [t["dst"] for t in s["transitions"]][-2:] == ["landing", "disarmed"]
    assert Path(s["log"]).parent == cwd / "flights" and "rate" in r.stderr  # the status line


@pytest.mark.parametrize("case", ["scheme", "corrupt", "mismatch", "plant", "missing", "rate"])
def test_deploy_bad_input_is_one_line(bundles, case, tmp_path):
    cwd, b = bundles
    bundle, uri, extra = str(b["quadrotor-hover"]), "sim://quadrotor-hover", []
    if case == "scheme":
        uri = "tcp://localhost:1"
    elif case == "corrupt":
        bad = tmp_path / "bad"
        bad.mkdir()
        for f in b["quadrotor-hover"].iterdir():
            if f.is_file():
                (bad / f.name).write_bytes(f.read_bytes())
        (bad / "policy.onnx").write_bytes(b"not onnx")
        bundle = str(bad)
    elif case == "mismatch":
        bundle = str(b["pendulum"])
    elif case == "plant":
        uri = "sim://quadrotor-hover?wingspan=3"
    elif case == "missing":
        bundle = str(tmp_path / "none")
    elif case == "rate":
        extra = ["--rate", "-5"]
    r = cli(["deploy", "--bundle", bundle, "--robot", uri, "--duration", "0.2", *extra], cwd)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr
    if case == "scheme":
        assert "sim://" in lines[0]
    if case == "mismatch":
        assert "does not match" in lines[0]
