"""Errors a user can cause end in one clear line on stderr and exit status 2, never a traceback, and
nothing already written is lost (STYLE.md rule 14).

Most cases call ``embodied.cli.main(argv)`` in-process with fd-level capture (a subprocess costs ~2 s of
imports per case); ``test_real_process`` runs a representative case of each kind through
``python -m embodied.cli`` to check the same contract end to end (exit status, stray warnings)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.cli import main

EXIT_USER_ERROR = 2


def cli_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def check_one_line(returncode: int, stdout: str, stderr: str) -> str:
    """The one-line-error contract; returns that line."""
    assert "Traceback" not in stderr, stderr[-4000:]
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr[-4000:]}"
    line = lines[0]
    assert line.startswith("error:") and line[len("error:"):].strip(), line
    assert returncode == EXIT_USER_ERROR, (returncode, line)
    assert stdout == ""
    return line


@pytest.fixture
def user_error(capfd):
    """``user_error(argv) -> line``: run the CLI in-process and check the one-line-error contract."""

    def run(args: list[str]) -> str:
        capfd.readouterr()
        rc = main(args)
        out, err = capfd.readouterr()
        return check_one_line(rc, out, err)

    return run


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory) -> Path:
    """A real, finished debug run with one checkpoint (tests copy it before changing anything)."""
    cwd = tmp_path_factory.mktemp("debug_run")
    proc = run_cli(["train", "--task", "pendulum", "--preset", "debug", "--run-dir", "run", "total_steps=256",
                    "log.progress=false", "log.tensorboard=false"], cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = cwd / "run"
    assert len(list((run / "checkpoints").glob("ckpt_*.pt"))) == 1
    return run


# ---- config and command-line errors (no run needed) ---------------------------------------------------
TRAIN = ["train", "--task", "pendulum", "--preset", "debug", "log.progress=false"]


def test_unknown_task_lists_known_tasks(user_error):
    line = user_error(["train", "--task", "nope", "--preset", "debug"])
    assert "nope" in line
    for name in ("pendulum", "quadrotor-hover", "target"):
        assert name in line


def test_unknown_preset_lists_presets(user_error):
    line = user_error(["train", "--task", "pendulum", "--preset", "nope"])
    assert "nope" in line and "debug" in line and "quadrotor-hover" in line


@pytest.mark.parametrize("override", ["nonexistent=1", "env.nope=1", "log.nope=1", "seed=abc", "num_envs=x",
                                      "sac.batch_size=1.5", "total_steps", "env.episode_steps"])
def test_bad_override(user_error, tmp_path, override):
    line = user_error([*TRAIN, "--run-dir", str(tmp_path / "r"), override])
    assert override.partition("=")[0].rpartition(".")[2] in line  # names the offending key
    assert not (tmp_path / "r").exists()  # rejected before anything was written


@pytest.mark.parametrize("args", [[], ["--bogus"], ["train", "--bogus"], ["nope"], ["eval"],
                                  ["eval", "--run", "r", "--episodes", "x"]],
                         ids=["no-subcommand", "unknown-flag", "unknown-train-flag", "unknown-subcommand",
                              "eval-without-run", "eval-episodes-not-int"])
def test_bad_command_line(user_error, args):
    user_error(args)


def test_train_without_task(user_error):
    assert "--task" in user_error(["train", "--preset", "debug"])


def test_eval_zero_episodes(user_error, debug_run):
    user_error(["eval", "--run", str(debug_run), "--episodes", "0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the request is valid")
@pytest.mark.parametrize("override", ["sim_device=cuda", "learner_device=cuda"])
def test_missing_cuda_is_an_error(user_error, tmp_path, override):
    line = user_error([*TRAIN, "--run-dir", str(tmp_path / "r"), override])
    assert "cuda" in line.lower()
    assert not (tmp_path / "r" / "checkpoints").exists()


# ---- run-directory errors ----------------------------------------------------------------------------
def _eval(run: Path) -> list[str]:
    return ["eval", "--run", str(run), "--episodes", "2"]


def _resume(run: Path) -> list[str]:
    return ["train", "--resume", str(run), "total_steps=512"]  # the debug run finished at 256: extended


@pytest.mark.parametrize("budget", [[], ["total_steps=100"]], ids=["finished", "below-the-checkpoint"])
def test_resuming_with_nothing_left_to_train_is_one_line(user_error, tmp_path, debug_run, budget):
    """A finished run (or a budget at or below its checkpoint) has nothing to resume: one line, nothing written
    (the loops ran one more iteration past the budget before)."""
    run = tmp_path / "run"
    shutil.copytree(debug_run, run)
    before = snapshot(run)
    line = user_error(["train", "--resume", str(run), *budget])
    assert "nothing to resume" in line and "step 256" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("command", [_eval, _resume], ids=["eval", "resume"])
def test_missing_run_dir(user_error, tmp_path, command):
    line = user_error(command(tmp_path / "no_such_run"))
    assert "no_such_run" in line
    assert not (tmp_path / "no_such_run").exists()


@pytest.mark.parametrize("command", [_eval, _resume], ids=["eval", "resume"])
def test_run_dir_without_checkpoints(user_error, tmp_path, command):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("task: pendulum\n")
    before = snapshot(run)
    assert "checkpoint" in user_error(command(run))
    assert snapshot(run) == before


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 20)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _not_a_checkpoint(path: Path) -> None:
    torch.save({"hello": torch.zeros(3)}, path)  # a valid torch file, but not a checkpoint


CORRUPTIONS = [_truncate, _garbage, _empty, _not_a_checkpoint]


def corrupted_copy(debug_run: Path, dest: Path, corrupt) -> tuple[Path, Path]:
    """A copy of ``debug_run`` at ``dest`` whose newest checkpoint went through ``corrupt``."""
    shutil.copytree(debug_run, dest)
    newest = sorted((dest / "checkpoints").glob("ckpt_*.pt"))[-1]
    corrupt(newest)
    return dest, newest


@pytest.mark.parametrize("command", [_eval, _resume], ids=["eval", "resume"])
@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_corrupt_checkpoint(user_error, tmp_path, debug_run, corrupt, command):
    run, newest = corrupted_copy(debug_run, tmp_path / "run", corrupt)
    before = snapshot(run)
    assert {"metrics.jsonl", "config.yaml"} <= set(before)
    line = user_error(command(run))
    assert "checkpoint" in line and newest.name in line
    assert snapshot(run) == before  # metrics.jsonl, config.yaml and the bad file itself are untouched


@pytest.mark.parametrize("override", ["seed=1", "num_envs=2", "total_steps=abc", "total_steps"])
def test_resume_accepts_only_total_steps(user_error, debug_run, override):
    before = snapshot(debug_run)
    assert override in user_error([*_resume(debug_run), override])
    assert snapshot(debug_run) == before


# ---- the same contract through a real process ----------------------------------------------------------
REAL_PROCESS_CASES = {
    "unknown-task": lambda tmp, run: ["train", "--task", "nope"],
    "bad-override-key": lambda tmp, run: [*TRAIN, "--run-dir", str(tmp / "r"), "env.nope=1"],
    "bad-override-value": lambda tmp, run: [*TRAIN, "--run-dir", str(tmp / "r"), "seed=abc"],
    "no-subcommand": lambda tmp, run: [],
    "missing-run-dir": lambda tmp, run: _resume(tmp / "no_such_run"),
    "resume-override": lambda tmp, run: [*_resume(run), "seed=1"],
    "corrupt-eval": lambda tmp, run: _eval(corrupted_copy(run, tmp / "c", _truncate)[0]),
    "corrupt-resume": lambda tmp, run: _resume(corrupted_copy(run, tmp / "c", _garbage)[0]),
}
if not torch.cuda.is_available():
    REAL_PROCESS_CASES["missing-cuda"] = lambda tmp, run: [*TRAIN, "--run-dir", str(tmp / "r"), "sim_device=cuda"]


@pytest.mark.parametrize("case", list(REAL_PROCESS_CASES))
def test_real_process(tmp_path, debug_run, case):
    args = REAL_PROCESS_CASES[case](tmp_path, debug_run)
    proc = run_cli(args, tmp_path)
    check_one_line(proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("task,overrides,words", [
    ("quadrotor-hover", ["algo=ppo"], ["symmetrize", "ppo"]),
    ("pendulum", ["algo=td3", "policy.symmetrize=true"], ["symmetry"]),
    ("quadrotor-hover", ["policy.actor_hidden=[30,30]"], ["multiples", "4"]),
], ids=["symmetrize-ppo", "no-symmetry-group", "width-not-multiple"])
def test_symmetry_misconfiguration(user_error, tmp_path, task, overrides, words):
    line = user_error(["train", "--task", task, "--preset", "debug", "--run-dir", str(tmp_path / "r"),
                       "log.progress=false", *overrides])
    for w in words:
        assert w in line


# ---- inputs a new user tried (issue 8): each one line, and no run directory left behind ----------------
@pytest.mark.parametrize("override,word", [
    ("sim_device=tpu", "tpu"), ("learner_device=tpu", "tpu"), ("policy.actor_hidden=[1,2", "actor_hidden"),
    ("ppo.lr=-1", "ppo.lr"), ("stop_passes=0", "stop_passes"), ("stop_confirm=later", "stop_confirm"),
    ("ensemble_replay=all", "ensemble_replay"),
], ids=["sim-device", "learner-device", "unclosed-list", "negative-lr", "stop-passes", "stop-confirm",
        "ensemble-replay"])
def test_bad_values_a_new_user_tried(user_error, tmp_path, override, word):
    line = user_error([*TRAIN, "--run-dir", str(tmp_path / "r"), override])
    assert word in line
    assert not (tmp_path / "r").exists()  # a failed start leaves no empty run directory


@pytest.mark.parametrize("task,overrides,word", [
    ("pendulum", ["ppo.num_steps=0"], "ppo.num_steps"),  # a traceback (TypeError) before
    ("pendulum", ["algo=sac", "sac.tau=2"], "sac.tau"),  # these three trained in silence before
    ("pendulum", ["algo=td3", "td3.batch_size=0"], "td3.batch_size"),
    ("pendulum", ["ppo.gamma=1.5"], "ppo.gamma"),
    ("quadrotor-hover", ["env.episode_s=0"], "env.episode_s"),
    ("quadrotor-hover", ["env.success_radius=-1"], "env.success_radius"),
    ("quadrotor-hover", ["env.success_radius=0.7"], "termination_radius"),
    ("quadrotor-hover", ["env.init_guidance=2"], "env.init_guidance"),
    ("pendulum", ["stop_success=1.5"], "stop_success"),  # a run that could never stop early
    ("pendulum", ["log.eval_episodes=0"], "eval_episodes"),  # failed at the first evaluation, after training
    ("point-reach", ["algo=filtered-bc", "filtered-bc.keep=mixed"], "filtered-bc.keep"),  # mixed needs groups
    ("point-reach", ["algo=filtered-bc", "filtered-bc.demo_starts.fraction=2"], "demo_starts.fraction"),
    ("point-reach", ["algo=grpo", "grpo.group_size=2", "grpo.demo_starts.fraction=0.5"], "give data=PATH"),
], ids=["ppo-num-steps", "sac-tau", "td3-batch", "ppo-gamma", "episode-length", "success-radius",
        "success-outside-termination", "guidance", "stop-success", "eval-episodes", "filtered-bc-keep",
        "demo-starts-fraction", "demo-starts-without-data"])
def test_settings_out_of_range_are_one_line(user_error, tmp_path, task, overrides, word):
    line = user_error(["train", "--task", task, "--preset", "debug", "--run-dir", str(tmp_path / "r"), *overrides])
    assert word in line and not (tmp_path / "r").exists()


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_a_reversed_randomization_range_is_refused_even_when_off(user_error, tmp_path, enabled):
    """A range the user set is checked whether or not randomization is on: off, it was silently ignored."""
    line = user_error(["train", "--task", "quadrotor-hover", "--preset", "debug", "--run-dir", str(tmp_path / "r"),
                       f"env.domain_randomization.enabled={enabled}", "env.domain_randomization.mass=[1.2,0.8]"])
    assert "domain_randomization.mass" in line and not (tmp_path / "r").exists()


@pytest.mark.parametrize("override,word", [
    ("dreamer-ac.actor_grad=dynamics", "wm:<task>"), ("dreamer-ac.actor_grad=nope", "actor_grad"),
], ids=["dynamics-without-a-learned-model", "unknown-actor-grad"])
def test_dreamer_actor_gradient_settings(user_error, tmp_path, override, word):
    line = user_error([*TRAIN, "--run-dir", str(tmp_path / "r"), "algo=dreamer-ac", override])
    assert word in line


def test_unwritable_run_root(user_error, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    line = user_error([*TRAIN, f"log.run_root={blocker / 'runs'}"])
    assert "run directory" in line and "a_file" in line


def test_failed_start_in_a_new_run_root_leaves_nothing(user_error, tmp_path):
    user_error([*TRAIN, f"log.run_root={tmp_path / 'runs'}", "ppo.lr=-1"])
    assert not (tmp_path / "runs").exists()  # nor the task's folder or the root it made
    (tmp_path / "kept" / "pendulum").mkdir(parents=True)  # folders that were there before stay
    user_error([*TRAIN, f"log.run_root={tmp_path / 'kept'}", "ppo.lr=-1"])
    assert (tmp_path / "kept" / "pendulum").is_dir() and not list((tmp_path / "kept" / "pendulum").iterdir())


@pytest.mark.parametrize("command", [_eval, _resume], ids=["eval", "resume"])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(capfd, tmp_path, debug_run, command):
    run = tmp_path / "run"
    shutil.copytree(debug_run, run)
    intact = sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1]
    newest = intact.with_name("ckpt_999999999999.pt")
    newest.write_bytes(intact.read_bytes()[:100])  # a newer checkpoint, torn
    capfd.readouterr()
    assert main(command(run)) == 0
    err = capfd.readouterr().err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and newest.name in warnings[0] and intact.name in warnings[0], err[-2000:]
    assert "Traceback" not in err


# ---- driving scenes (issue 10): a scene directory without its route, a .ply lacking a property -------------
@pytest.mark.parametrize("case,word", [("no-route", "route"), ("no-opacity", "opacity"), ("cameras", "cameras"),
                                       ("actions", "actions")])
def test_bad_driving_inputs(user_error, tmp_path, case, word):
    from embodied.sim_backends.splat.procedural import write_scene

    scene = tmp_path / "scene"
    overrides = [f"env.scene_dir={scene}", "env.observation=state"]
    if case in ("no-route", "no-opacity"):
        write_scene(2, scene)
        if case == "no-route":
            (scene / "route.json").unlink()
        else:
            from plyfile import PlyData, PlyElement

            v = PlyData.read(str(scene / "scene.ply"))["vertex"].data
            keep = [n for n in v.dtype.names if n != "opacity"]
            data = np.empty(len(v), dtype=[(n, "f4") for n in keep])
            for n in keep:
                data[n] = v[n]
            PlyData([PlyElement.describe(data, "vertex")]).write(str(scene / "scene.ply"))
    else:
        overrides = {"cameras": ["env.cameras=4"], "actions": ["env.actions=joystick"]}[case]
    line = user_error(["train", "--task", "drive-lane-keep", "--run-dir", str(tmp_path / "r"), "total_steps=64",
                       "log.progress=false", *overrides])
    assert word in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("override,word", [
    ("env.probe_steps=0", "probe_steps"), ("env.moving_cars=-1", "moving_cars"),
    ("env.blocking_cars=[3,1]", "blocking_cars"), ("env.start_speed=[1]", "start_speed"),
    ("env.image_height=33", "36"), ("algo=td3", "image encoder")])
def test_bad_driving_values(user_error, tmp_path, override, word):
    line = user_error(["train", "--task", "drive-lane-keep", "--run-dir", str(tmp_path / "r"), "total_steps=64",
                       "log.progress=false", override])
    assert word in line


@pytest.mark.parametrize("where", ["a_file", "a_file/sub", "full/dir"], ids=["file", "under-a-file", "not-empty"])
def test_collect_demos_into_a_path_it_cannot_use(user_error, tmp_path, where):
    """Checked before the expert plays (a traceback after the rollouts before); nothing is left behind."""
    (tmp_path / "a_file").write_text("data")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "dir").mkdir()
    (tmp_path / "full" / "dir" / "kept.txt").write_text("kept")
    before = snapshot(tmp_path)
    line = user_error(["collect-demos", "--task", "reach", "--episodes", "2", "--out", str(tmp_path / where)])
    assert str(tmp_path / where) in line
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "full"]
