"""The ``embodied`` command line end to end, in subprocesses: ``tasks``, ``train`` and ``eval --video``
on the debug preset, the run directory they leave, ``embodied.load_policy`` on it, and overrides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import embodied

DEBUG_TOTAL_STEPS = 2048  # configs/debug.yaml


def cli_env() -> dict[str, str]:
    # one intra-op thread: the CPU is shared, and tiny networks only lose from thread contention
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def ok_json(proc: subprocess.CompletedProcess) -> dict:
    """A successful command prints exactly one JSON object on stdout."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def test_tasks_lists_registered_tasks(tmp_path):
    proc = run_cli(["tasks"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert {"pendulum", "target", "quadrotor-hover"} <= names
    # the learner a default run really trains (the quadrotor's preset trains TD3; the listing said sac)
    algo = {line.split()[0]: line.rsplit("algo: ", 1)[1].rstrip("]") for line in proc.stdout.splitlines()
            if "algo: " in line}
    assert algo["quadrotor-hover"] == "td3" and algo["pendulum"] == "ppo" and algo["halfcheetah"] == "ppo"
    # where each backend simulates: MuJoCo on the CPU only, the tensor simulators on either
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert "mujoco_cpu (cpu);" in lines["halfcheetah"] and "torch_vec (cpu/cuda);" in lines["quadrotor-hover"]


def test_a_closed_pipe_ends_the_listing_quietly(tmp_path):
    # the reader closes its end before the command prints (it is still importing): every write meets EPIPE
    proc = subprocess.Popen([sys.executable, "-m", "embodied.cli", "tasks"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_progress_off_a_terminal_prints_a_line_every_few_seconds(tmp_path, capsys):
    from embodied.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, tensorboard=False, progress=True, total_steps=1000)
    for step in range(0, 1000, 10):  # a hundred updates within a fraction of a second
        logger.show(step, 1e4, -1.0, None)
    logger.show(1000, 1e4, -1.0, None, force=True)
    logger.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[-1].startswith("step     1,000/1,000")  # the first and the final one


# pendulum episodes are shortened: the video draws every one of its control steps with matplotlib
TRAINED = [("quadrotor-hover", "td3", []), ("pendulum", "ppo", ["env.episode_steps=50"])]


@pytest.fixture(scope="module", params=TRAINED, ids=lambda p: p[0])
def trained(request, tmp_path_factory):
    """``train --preset debug`` then ``eval --episodes 4 --video`` on the run; both printed JSONs."""
    task, algo, extra = request.param
    cwd = tmp_path_factory.mktemp(task)
    train_out = ok_json(run_cli(["train", "--task", task, "--preset", "debug", "--run-dir", "run",
                                 "log.progress=false", *extra], cwd))
    eval_out = ok_json(run_cli(["eval", "--run", "run", "--episodes", "4", "--video"], cwd))
    return {"task": task, "algo": algo, "cwd": cwd, "run_dir": cwd / "run", "train": train_out, "eval": eval_out}


def test_train_prints_summary(trained):
    out = trained["train"]
    assert Path(trained["cwd"], out["run_dir"]).resolve() == trained["run_dir"].resolve()
    assert out["step"] == DEBUG_TOTAL_STEPS
    assert out["train_s"] > 0
    assert "eval/return" in out


def test_train_writes_run_directory(trained):
    run = trained["run_dir"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["task"] == trained["task"] and cfg["algo"] == trained["algo"]
    assert cfg["total_steps"] == DEBUG_TOTAL_STEPS

    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # every line is valid JSON
    assert rows and all("step" in r for r in rows)
    assert rows[-1]["step"] == DEBUG_TOTAL_STEPS
    assert any("eval/return" in r for r in rows) and any("time/train_s" in r for r in rows)

    events = list((run / "tb").glob("events.out.tfevents.*"))
    assert events and all(e.stat().st_size > 0 for e in events)

    ckpts = sorted((run / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts and ckpts[-1].name == f"ckpt_{DEBUG_TOTAL_STEPS:012d}.pt"
    assert not list((run / "checkpoints").glob("*.tmp"))

    png = run / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_prints_json_and_writes_video(trained):
    out = trained["eval"]
    assert out["task"] == trained["task"] and out["episodes"] == 4 and out["step"] == DEBUG_TOTAL_STEPS
    assert isinstance(out["eval/return"], float)
    if trained["task"] == "quadrotor-hover":  # pendulum has no success criterion, so no success key
        assert 0.0 <= out["eval/success"] <= 1.0
    import cv2

    videos = list((trained["run_dir"] / "videos").glob("*.mp4"))
    assert len(videos) == 1
    assert Path(trained["cwd"], out["video"]).resolve() == videos[0].resolve()
    cap = cv2.VideoCapture(str(videos[0]))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) > 1 and frames[0].ndim == 3 and frames[0].shape[2] == 3


def test_load_policy_acts(trained):
    policy = embodied.load_policy(trained["run_dir"])
    env = embodied.make_env(trained["task"], num_envs=3, seed=7)
    obs, _ = env.reset()
    action = policy.act(obs["policy"])
    assert action.shape == (3, *env.single_action_space.shape)
    assert action.dtype == torch.float32 and torch.isfinite(action).all()
    assert action.abs().max() <= 1.0
    obs, *_ = env.step(action)  # the env accepts what the policy produces
    assert torch.equal(policy.act(obs["policy"]), policy.act(obs["policy"]))  # deterministic


def test_overrides_reach_config(tmp_path):
    out = ok_json(run_cli(["train", "--task", "pendulum", "--preset", "debug", "--run-dir", str(tmp_path / "r"),
                           "total_steps=512", "seed=3", "log.progress=false", "log.tensorboard=false"], tmp_path))
    assert out["step"] == 512
    cfg = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert cfg["total_steps"] == 512 and cfg["seed"] == 3
    assert cfg["num_envs"] == 4  # the debug preset still applies beneath the overrides
    assert cfg["log"]["tensorboard"] is False and not (tmp_path / "r" / "tb").exists()
    assert [p.name for p in (tmp_path / "r" / "checkpoints").glob("ckpt_*.pt")] == ["ckpt_000000000512.pt"]
