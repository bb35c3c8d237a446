"""Smoke tests of the quadrotor benchmark scripts: they run, and their JSON has the documented keys.
No timing asserts: timings belong in the benchmark's output, not in the test suite (STYLE.md 13)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench_quadrotor_sim.py"


def run_quick(env: dict | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)  # exactly one JSON object on stdout


def test_bench_quadrotor_sim_quick():
    out = run_quick()
    assert out["benchmark"] == "quadrotor_sim"
    assert out["quick"] is True
    sizes = [str(n) for n in out["sizes"]]
    assert sizes == ["1", "64"]
    for name in ("sim_numba", "sim_torch", "task_step", "task_done_fraction"):
        assert set(out["ours"][name]) == set(sizes), name
        assert all(v >= 0 for v in out["ours"][name].values()), name
    for name in ("sim_numba_over_l2f_step", "sim_torch_over_l2f_step", "task_step_over_l2f_full_loop"):
        assert set(out["ratio_ours_over_l2f"][name]) == set(sizes), name
    assert {"sim_numba", "sim_torch", "task_step"} <= set(out["per_call_us_at_N1"])
    if out["l2f"] is None:  # the peer is optional; then the reason is given
        assert isinstance(out["l2f_unavailable_reason"], str) and out["l2f_unavailable_reason"]
    else:
        assert out["l2f_unavailable_reason"] is None
        for name in ("step", "full_loop", "layout"):
            assert set(out["l2f"][name]) == set(sizes), name
        assert {"l2f_step", "l2f_full_loop"} <= set(out["per_call_us_at_N1"])


def test_bench_quadrotor_sim_without_l2f(tmp_path):
    """The peer missing (a module on PYTHONPATH that fails to import) gives ``"l2f": null`` and a
    reason, and ours is still reported."""
    (tmp_path / "l2f.py").write_text('raise ImportError("l2f blocked by the smoke test")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    out = run_quick(env)
    assert out["l2f"] is None
    assert "blocked by the smoke test" in out["l2f_unavailable_reason"]
    assert set(out["ours"]["sim_numba"]) == {"1", "64"}
    assert all(v is None for v in out["ratio_ours_over_l2f"]["sim_numba_over_l2f_step"].values())


def test_bench_td3_update_runs_ours_and_the_sb3_peer():
    script = SCRIPT.parent / "bench_td3_update.py"
    proc = subprocess.run([sys.executable, str(script), "--updates", "5", "--fill", "1000"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["benchmark"] == "td3_update" and out["ours"]["policy_obs_dim"] == out["sb3_td3"]["obs_dim"]
    for name in ("ours", "ours_plain", "sb3_td3"):
        assert out[name]["ms_per_update"] > 0, name
    assert out["ours_over_sb3"] > 0


def test_bench_hover_ceiling_flies_an_ensemble_run_and_its_members(tmp_path):
    """A two-member ensemble run (a few hundred steps, randomized plants) flown from the same starts: its success, each
    member's, success by thrust-to-weight and by each randomized factor's thirds."""
    from embodied.config import load_config
    from embodied.train import train

    cfg = load_config("quadrotor-hover", "debug", ["total_steps=256", "ensemble=2", "log.progress=false",
                                                    "log.tensorboard=false", "env.domain_randomization.enabled=true"])
    run_dir, _ = train(cfg, tmp_path / "run")
    script = SCRIPT.parent / "bench_hover_ceiling.py"
    proc = subprocess.run([sys.executable, str(script), str(run_dir), "--members", "--episodes", "16"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    row = out["runs"][0]
    assert len(row["members"]) == 2 and all(0 <= s <= 1 for s in [*row["members"], row["members_median"]])
    assert list(out["by_factor"]) == ["mass", "inertia_xx", "thrust_constant", "torque_constant",
                                      "motor_time_constant", "obs_noise"]
    for bins in [*out["by_factor"].values(), out["by_thrust_to_weight"]["crashed"]]:
        assert sum(b["starts"] for b in bins) == 16  # every start in one bin (the thrust-to-weight bins span them all)
        assert all(b["success"] is None or 0 <= b["success"] <= 1 for b in bins)
    assert out["by_factor"]["mass"][0]["range"] == [0.75, 0.75 + 0.5 / 3]  # thirds of the training range


def test_bench_hover_feasibility_searches_the_starts_a_policy_fails(tmp_path):
    """A barely trained domain-randomized run: every start it fails is searched, the figure counts the policy's
    successes and the found controllers, and the unflown starts are listed by seed and plant."""
    from embodied.config import load_config
    from embodied.train import train

    cfg = load_config("quadrotor-hover", "debug", ["total_steps=256", "env.domain_randomization.enabled=true",
                                                    "log.progress=false", "log.tensorboard=false"])
    run_dir, _ = train(cfg, tmp_path / "run")
    script = SCRIPT.parent / "bench_hover_feasibility.py"
    proc = subprocess.run([sys.executable, str(script), str(run_dir), "--episodes", "6", "--population", "4",
                           "--iterations", "2", "--elites", "2", "--batch", "4"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["searched"] == round(6 * (1 - out["policy_success"])) and 0 <= out["found"] <= out["searched"]
    assert out["feasible_at_least"] == round(out["policy_success"] + out["found"] / 6, 4)
    assert sum(out["found_at_iteration"]) == out["found"]
    unflown = out["unflown"]
    assert unflown["starts"] == out["searched"] - out["found"] == len(unflown["seeds"])
    assert len(out["unflown_thrust_to_weight"]) == unflown["starts"]
    assert [b["starts"] for b in out["by_thrust_to_weight"]["policy"]] == \
        [b["starts"] for b in out["by_thrust_to_weight"]["feasible_at_least"]]


def test_pick_failures_frozen_reads_each_episode_last_steps():
    """``froze``: the grip point moved < 2 mm between an episode's 20th-last step and its last; its own episode's rows
    only (a shorter episode never counts)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("bench_pick_failures", SCRIPT.parent / "bench_pick_failures.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # its _machine import resolves through the sys.path entry it adds itself
    assert bench.FROZEN_STEPS == 20 and bench.FROZEN_MM == 2.0
    frozen = bench.frozen
    path = torch.zeros(40, 4, 3, dtype=torch.float64)
    path[:, 0, 0] = torch.arange(40) * 0.01  # moves 1 cm a step throughout
    path[:20, 1, 0] = torch.arange(20) * 0.01  # moves, then rests from its 20th-last step on: froze
    path[19:, 1, 0] = 0.19
    path[:, 2, 1] = torch.arange(40) * 0.0000999  # 1.998 mm over 20 steps: froze; 3: a 15-step episode
    length = torch.tensor([40, 40, 21, 15])
    assert frozen(path, length).tolist() == [False, True, True, False]
    path[:21, 2, 1] = torch.arange(21) * 0.000101  # 2.02 mm over its 20 steps: moved
    assert frozen(path, length).tolist() == [False, True, False, False]


def test_start_repeats_binomial_is_independent_luck_at_the_mean():
    """The histogram failures by independent luck would give: n starts x C(r, j) p^j (1 - p)^(r - j)."""
    import importlib.util

    import pytest

    spec = importlib.util.spec_from_file_location("bench_start_repeats", SCRIPT.parent / "bench_start_repeats.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.binomial(100, 2, 0.5) == [25.0, 50.0, 25.0]
    assert bench.binomial(10, 3, 0.2) == pytest.approx([5.12, 3.84, 0.96, 0.08])
    assert bench.binomial(7, 4, 1.0) == [0.0, 0.0, 0.0, 0.0, 7.0]
