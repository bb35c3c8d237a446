"""Export: the policy program against the torch actor (every actor kind), ONNX and C parity on observations
recorded from the task, the closed loop with the runner keeping the action history, the generated C's
constraints (-Werror, no malloc/stdio, flash size), the layout as data, and bad bundles."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

import embodied
from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.core.layout import Layout, Term
from embodied.hardware import export_run, load_bundle, read_bundle
from embodied.hardware.codegen import compile_object
from embodied.hardware.firmware import build_firmware
from embodied.policies import DeterministicActor, GaussianActor, SquashedGaussianActor
from embodied.policies.export import ProgramModule, fold, program, run_numpy
from embodied.train import train

TOL = 1e-5


@pytest.fixture(scope="module", params=["quadrotor-hover", "pendulum"])
def bundle(request, tmp_path_factory):
    """A short run of the task (its default learner and policy: TD3 with the equivariant actor / PPO with a
    normalizing Gaussian actor), exported in every format."""
    task = request.param
    root = tmp_path_factory.mktemp(task)
    cfg = load_config(task, "debug", ["total_steps=512", "log.progress=false", "log.tensorboard=false"])
    run_dir, _ = train(cfg, root / "run")
    meta = export_run(run_dir, root / "bundle", "all")
    return {"task": task, "run": run_dir, "dir": root / "bundle", "meta": meta}


def test_bundle_files_and_parity(bundle):
    meta, d = bundle["meta"], bundle["dir"]
    for name in ("policy.onnx", "bundle.json", "parity.json", "observations.npy", "policy.c", "policy.h",
                 "firmware.c"):
        assert (d / name).is_file(), name
    p = json.loads((d / "parity.json").read_text())
    assert p["observations"] >= 1000 and p["passed"]
    assert p["torch_vs_onnxruntime"] <= TOL and p["c_vs_onnxruntime"] <= TOL and p["c_vs_torch"] <= TOL
    on_disk = json.loads((d / "bundle.json").read_text())
    assert on_disk["task"] == bundle["task"] and len(on_disk["run"]["config_sha256"]) == 64
    assert on_disk["run"]["provenance"] is not None and "commit" in on_disk["run"]["provenance"]
    assert set(on_disk["files"]) >= {"policy.onnx", "policy.c", "policy.h", "firmware.c", "observations.npy"}
    assert meta["c"]["fits_64k_flash"] and 0 < meta["c"]["size"]["flash"] <= 64 * 1024


def test_onnx_graph_is_plain_matmuls(bundle):
    import onnx

    model = onnx.load(str(bundle["dir"] / "policy.onnx"))
    kinds = {n.op_type for n in model.graph.node}
    assert kinds <= {"Gemm", "Relu", "Tanh", "Elu", "Clip", "Sub", "Div", "Slice"}, kinds
    assert [i.name for i in model.graph.input] == ["obs"] and [o.name for o in model.graph.output] == ["action"]


@pytest.mark.parametrize("backend", ["onnx", "c"])
def test_runner_forward_matches_torch(bundle, backend):
    runner = load_bundle(bundle["dir"], backend)
    obs = np.load(bundle["dir"] / "observations.npy")
    policy = embodied.load_policy(bundle["run"])
    ref = policy.act(torch.from_numpy(obs)).numpy()
    assert np.abs(runner.forward(obs) - ref).max() <= TOL


@pytest.mark.parametrize("backend", ["onnx", "c"])
def test_runner_keeps_the_action_history_in_closed_loop(bundle, backend):
    """The runner sees only the robot's terms and builds the rest; flying the task with its actions gives
    the torch policy's action on the task's own (full) observation at every step, across episode ends."""
    runner = load_bundle(bundle["dir"], backend)
    layout, policy = runner.layout, embodied.load_policy(bundle["run"])
    env = embodied.make_env(bundle["task"], num_envs=1)
    robot = [layout.slices("policy")[t.name] for t in layout.robot_terms()]
    obs, _ = env.reset(seed=4)
    runner.reset()
    worst, ends = 0.0, 0
    for _ in range(env.max_episode_steps + 50):
        full = obs["policy"]
        state = np.concatenate([full[0, sl].numpy() for sl in robot])
        a = runner.act(state)
        worst = max(worst, float(np.abs(a - policy.act(full)[0].numpy()).max()))
        obs, _, term, trunc, _ = env.step(torch.from_numpy(np.asarray(a, np.float32))[None])
        if bool(term[0] or trunc[0]):
            runner.reset()
            ends += 1
    assert ends >= 1 and worst <= TOL


def test_generated_c_is_freestanding(bundle, tmp_path):
    src = (bundle["dir"] / "policy.c").read_text()
    code = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    for banned in ("malloc", "calloc", "realloc", "free(", "printf", "stdio", "FILE", "stdlib"):
        assert banned not in code, banned
    assert re.findall(r"#include <([^>]+)>", code) == ["math.h"]
    assert "static const float" in code
    compile_object(bundle["dir"] / "policy.c", tmp_path / "p.o", ["-I", str(bundle["dir"])])  # -Werror
    assert build_firmware(bundle["dir"], tmp_path / "firmware").is_file()


def test_quadrotor_actor_stores_shared_weights_once(bundle):
    if bundle["task"] != "quadrotor-hover":
        pytest.skip("the equivariant actor is the quadrotor's")
    size = bundle["meta"]["c"]["size"]
    actor = embodied.load_policy(bundle["run"]).actor
    folded = sum(op.arrays["W"].size + op.arrays["b"].size for op in fold(program(actor)[0]) if op.kind == "dense")
    assert folded * 4 > 100_000  # the folded 85-128-128-4 matrices are ~110 KB
    assert size["flash"] < folded * 4 / 2.5  # the free parameters: ~1/4 of them, plus code and index tables


# ---- the program, exactly ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["td3_group", "td3_plain_tanh_norm", "ppo_elu", "sac_group_norm"])
def test_program_equals_the_actor(kind):
    env = embodied.make_env("quadrotor-hover", num_envs=64)
    obs, _ = env.reset(seed=0)
    group = env.symmetry_group().to_spec()
    torch.manual_seed(1)
    d = env.single_observation_space["policy"].shape[0]  # 18 + 64 action history + 3 position average
    assert d == 85
    actor = {"td3_group": lambda: DeterministicActor(d, 4, [128, 128], "relu", False, group=group),
             "td3_plain_tanh_norm": lambda: DeterministicActor(d, 4, [64, 64], "tanh", True),
             "ppo_elu": lambda: GaussianActor(d, 4, [64, 32], "elu"),
             "sac_group_norm": lambda: SquashedGaussianActor(d, 4, [64, 64], "relu", True, group=group)}[kind]()
    x = obs["policy"]
    if hasattr(actor.normalizer, "update"):
        actor.normalizer.update(x * 3 + 1)
    for p in actor.parameters():
        p.data.normal_(0.0, 0.05)
    ref = actor.act(x).double().numpy()
    assert 0.01 < np.abs(ref).mean() < 0.9  # not saturated
    ops, dim = program(actor)
    assert dim == d
    assert np.abs(run_numpy(ops, x.numpy()) - ref).max() < 1e-6
    assert np.abs(run_numpy(fold(ops), x.numpy()) - ref).max() < 1e-6
    assert np.abs(ProgramModule(fold(ops))(x).detach().numpy() - ref).max() < 1e-6


# ---- layout --------------------------------------------------------------------------------------------
def test_quadrotor_layout_describes_its_observation():
    env = embodied.make_env("quadrotor-hover", num_envs=2, action_history=8)
    layout = env.layout()
    h = env.cfg.action_history
    assert [t.name for t in layout.terms("policy")] == ["pos_w", "rot_wb", "lin_vel_w", "ang_vel_b", "action_history",
                                                        "pos_w_average"]
    assert layout.group_size("policy") == env.single_observation_space["policy"].shape[0] == 18 + 4 * h + 3
    assert layout.robot_size() == 18 and layout.control_hz == 100.0
    assert layout.slices("policy")["action_history"] == slice(18, 18 + 4 * h)
    (hist,) = [t for t in layout.terms("policy") if t.source == "history"]
    assert hist.history_len == h and hist.size == 4 * h
    (act,) = layout.action
    assert act.offset + act.scale * 1.0 == pytest.approx(env.params.rpm_max) and act.offset + act.scale * -1 == 0
    obs, _ = env.reset(seed=1)
    sl = layout.slices("policy")["rot_wb"]
    rot = obs["policy"][:, sl].reshape(-1, 3, 3)  # a rotation matrix (up to the observation noise)
    assert torch.allclose(rot @ rot.transpose(1, 2), torch.eye(3).expand(2, 3, 3), atol=1e-2)
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout


def test_every_task_has_a_layout_that_matches_its_spaces():
    for name in ("pendulum", "target", "quadrotor-hover"):
        env = embodied.make_env(name, num_envs=1)
        layout = env.layout()
        layout.check({g: s.shape for g, s in env.single_observation_space.spaces.items()},
                     env.single_action_space.shape)
        assert layout.control_hz == pytest.approx(1.0 / env.control_dt)


def test_layout_rejects_bad_terms():
    with pytest.raises(ValueError):
        Term("x", 0)
    with pytest.raises(ValueError):
        Term("x", 3, source="sensor")
    with pytest.raises(ValueError):  # an average names what it averages and decays in [0, 1)
        Term("xa", 3, source="average", average_decay=0.5)
    with pytest.raises(ValueError):
        Term("xa", 3, source="average", average_of="x", average_decay=1.0)
    for bad in (Term("xa", 3, source="average", average_of="y", average_decay=0.5),  # no such robot term
                Term("xa", 2, source="average", average_of="x", average_decay=0.5)):  # another size
        with pytest.raises(ValueError, match="average term"):
            Layout({"policy": (Term("x", 3), bad)}, (), 1.0).check({"policy": (3 + bad.size,)}, (0,))
    with pytest.raises(UserError):
        Layout.from_dict({"observation": {"policy": [{"name": "x"}]}, "action": [], "control_hz": 1})


# ---- bad bundles ---------------------------------------------------------------------------------------
def test_corrupt_or_missing_bundle_is_one_user_error(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle["dir"], copy)
    with open(copy / "policy.onnx", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(UserError, match="policy.onnx .*hash"):
        load_bundle(copy)
    (copy / "bundle.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt bundle"):
        read_bundle(copy)
    with pytest.raises(UserError, match="bundle.json missing"):
        read_bundle(tmp_path / "nothing")
    with pytest.raises(UserError, match="backend"):
        load_bundle(bundle["dir"], "tflite")


def test_camera_policy_exports_to_onnx_with_parity(tmp_path):
    """A CNN policy on a camera image (image term in the middle of the vector): program == actor (numpy
    reference conv), the ONNX bundle's parity, the C format refused with one line, the normalizer passing the image
    through."""
    from embodied.core.layout import ActionTerm
    from embodied.hardware.bundle import write_bundle

    shape = (3, 40, 48)
    n_img = int(np.prod(shape))
    torch.manual_seed(0)
    actor = GaussianActor(2 + n_img + 1, 2, [32], "elu", True, image=[2, *shape])
    x = torch.cat([torch.randn(8, 2), torch.rand(8, n_img), torch.randn(8, 1)], 1)
    actor.normalizer.update(x * 2 + 0.5)
    assert torch.equal(actor.normalizer(x)[:, 2:2 + n_img], x[:, 2:2 + n_img])  # the image passes through
    for p in actor.parameters():
        p.data.normal_(0.0, 0.05)
    ref = actor.act(x).double().numpy()
    ops, dim = program(actor)
    assert [op.kind for op in ops][:2] == ["normalize", "image_features"]
    assert np.abs(run_numpy(ops, x.numpy()) - ref).max() < 1e-5
    assert np.abs(ProgramModule(fold(ops))(x).detach().numpy() - ref).max() < 1e-5
    layout = Layout({"policy": (Term("a", 2), Term("cam", n_img, shape=shape), Term("b", 1))},
                    (ActionTerm("u", 2),), 10.0)
    meta = write_bundle(actor, layout, x.numpy(), tmp_path / "b", "all")
    assert meta["parity"]["passed"] and meta["c"] == {"skipped": "camera-image policy: ONNX only"}
    assert load_bundle(tmp_path / "b").forward(x.numpy()).shape == (8, 2)
    with pytest.raises(UserError, match="ONNX only"):
        write_bundle(actor, layout, x.numpy(), tmp_path / "c", "c")


def test_residual_program_ops_exact_values():
    """save / concat_saved / residual_add (a residual over a base) on hand-made values, in the reference
    interpreter, the torch module and ONNX, and read back from ONNX."""
    import onnx
    import onnxruntime as ort

    from embodied.hardware.onnx_export import program_from_onnx, program_to_onnx
    from embodied.policies.export import Op

    # base: b = x0 - x1 (one dense row); residual: r = 10 * (x0 + b) (a dense on [x, b]); a = clip(b + clip(0.1 r,
    # -0.2, 0.2), -1, 1)
    ops = [Op("save"), Op("dense", {"W": np.array([[1.0, -1.0]], np.float32), "b": np.zeros(1, np.float32)}),
           Op("save"), Op("concat_saved", attrs={"index": 0, "size": 2}),
           Op("dense", {"W": np.array([[10.0, 0.0, 10.0]], np.float32), "b": np.zeros(1, np.float32)}),
           Op("residual_add", attrs={"index": 1, "scale": 0.1, "limit": 0.2})]
    x = np.array([[0.5, 0.25], [0.0, 0.0], [0.9, -0.3], [-0.1, 0.05]], np.float32)
    # b = 0.25, 0, 1.2, -0.15; 0.1 r = 0.75 -> 0.2, 0, 2.1 -> 0.2, -0.25 -> -0.2; a = 0.45, 0, 1 (clipped), -0.35
    expected = np.array([[0.45], [0.0], [1.0], [-0.35]])
    assert np.allclose(run_numpy(ops, x), expected, atol=1e-6)
    assert np.allclose(ProgramModule(ops)(torch.from_numpy(x)).detach().numpy(), expected, atol=1e-6)
    model = program_to_onnx(ops, 2)
    out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
    assert np.allclose(out, expected, atol=1e-6)
    with pytest.raises(UserError, match="Identity"):  # a composite graph is not a base program: one clear error
        program_from_onnx(onnx.load_from_string(model.SerializeToString()))
    # the second program of a residual over a chunked base reads [x0, b] (b given): load_saved brings [x0, b] back
    # after b is saved; r = 10 * (x0 + b), the same action as above for x0 = x[:, 0], b = x0 - x1
    staged = [Op("save"), Op("slice", attrs={"start": 1, "stop": 2}), Op("save"),
              Op("load_saved", attrs={"index": 0, "size": 2}),
              Op("dense", {"W": np.array([[10.0, 10.0]], np.float32), "b": np.zeros(1, np.float32)}), ops[-1]]
    xb = np.stack([x[:, 0], x[:, 0] - x[:, 1]], 1)
    assert np.allclose(run_numpy(staged, xb), expected, atol=1e-6)
    assert np.allclose(ProgramModule(staged)(torch.from_numpy(xb)).detach().numpy(), expected, atol=1e-6)
    model = program_to_onnx(staged, 2, input_name="obs_base")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.allclose(sess.run(None, {"obs_base": xb})[0], expected, atol=1e-6)
    # one scale and bound per action entry: b = [x0 - x1, x0 + x1], r = [10 (x0 + b0), 10 (x0 + b0)], scale
    # [0.1, 1], limit [0.2, 1.5]
    two = [Op("save"),
           Op("dense", {"W": np.array([[1.0, -1.0], [1.0, 1.0]], np.float32), "b": np.zeros(2, np.float32)}),
           Op("save"), Op("concat_saved", attrs={"index": 0, "size": 2}),
           Op("dense", {"W": np.array([[10.0, 0.0, 10.0, 0.0], [10.0, 0.0, 10.0, 0.0]], np.float32),
                        "b": np.zeros(2, np.float32)}),
           Op("residual_add", attrs={"index": 1, "scale": [0.1, 1.0], "limit": [0.2, 1.5]})]
    # entry 1: b1 = 0.75, 0, 0.6, -0.05; r = 7.5, 0, 21, -2.5 -> clip(1 r, +-1.5) = 1.5, 0, 1.5, -1.5
    # -> a1 = 1, 0, 1, -1 (clipped); entry 0 as above
    expected2 = np.concatenate([expected, [[1.0], [0.0], [1.0], [-1.0]]], 1)
    assert np.allclose(run_numpy(two, x), expected2, atol=1e-6)
    assert np.allclose(ProgramModule(two)(torch.from_numpy(x)).detach().numpy(), expected2, atol=1e-6)
    out = ort.InferenceSession(program_to_onnx(two, 2).SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
    assert np.allclose(out, expected2, atol=1e-6)


def _fly_beside(actor, runners, steps: int, new_episode_at: int) -> None:
    """Each runner's ``act`` on the robot state (3 entries) equals the torch actor's on the full observation (the
    state, then a 2-action history starting at 0.1), step by step, with a new episode at ``new_episode_at``."""
    actor.reset()
    hist = np.full(4, 0.1, np.float32)
    for t in range(steps):
        if t == new_episode_at:  # a new episode: the queues and the history restart
            for r in runners:
                r.reset()
            actor.reset()
            hist[:] = 0.1
        state = np.random.default_rng(t).normal(size=3).astype(np.float32)
        ref = actor.act(torch.from_numpy(np.concatenate([state, hist]))[None])[0].numpy()
        for r in runners:
            assert np.abs(r.act(state) - ref).max() <= TOL, (t, r.backend)
        hist = np.concatenate([hist[2:], np.clip(ref, -1, 1)])


def test_runner_keeps_average_terms(tmp_path):
    """An ``average`` term (a robot term's exponential average, as quadrotor-hover's ``position_average_s`` keeps it):
    the ONNX and C runners keep it from the reported state, its first value after a reset, then
    ``d * avg + (1 - d) * value``, and act as the torch actor does on the full observation, across a reset."""
    from embodied.core.layout import ActionTerm
    from embodied.hardware.bundle import write_bundle

    torch.manual_seed(2)
    d = 0.75
    layout = Layout({"policy": (Term("x", 3), Term("prev", 4, source="history", history_len=2, history_init=0.1),
                                Term("v", 2), Term("x_avg", 3, source="average", average_of="x", average_decay=d))},
                    (ActionTerm("u", 2),), 10.0)
    actor = SquashedGaussianActor(12, 2, [16], obs_normalization=True)
    actor.normalizer.update(torch.randn(64, 12) * 2 + 0.5)
    x = torch.randn(32, 12)
    meta = write_bundle(actor, layout, x.numpy(), tmp_path / "b", "all")
    assert meta["parity"]["passed"] and read_bundle(tmp_path / "b")["layout"] == layout
    runners = [load_bundle(tmp_path / "b", backend) for backend in ("onnx", "c")]
    hist = np.full(4, 0.1, np.float32)
    avg = None
    for t in range(9):
        if t == 6:  # a new episode: the history and the average restart
            for r in runners:
                r.reset()
            hist[:], avg = 0.1, None
        state = np.random.default_rng(t).normal(size=5).astype(np.float32)  # x (3), then v (2)
        avg = state[:3].copy() if avg is None else np.float32(d) * avg + np.float32(1 - d) * state[:3]
        obs = np.concatenate([state[:3], hist, state[3:], avg])
        ref = actor.act(torch.from_numpy(obs)[None])[0].numpy()
        for r in runners:
            assert np.abs(r.act(state) - ref).max() <= TOL, (t, r.backend)
        hist = np.concatenate([hist[2:], np.clip(ref, -1, 1)])


def test_chunked_policy_exports_and_runs_its_queue(tmp_path):
    """An action-chunked policy (ACT-style, ``bc.chunk``): its program outputs the whole chunk (parity on chunks),
    and the ONNX and C runners execute ``execute`` actions of each chunk before they look again, as the torch
    policy's queue does, with an action-history term in the observation and across a reset; a bundle's chunked
    policy read back as a residual's base keeps the queue too."""
    from embodied.algos.residual import load_base
    from embodied.core.layout import ActionTerm
    from embodied.hardware.bundle import write_bundle
    from embodied.policies import ChunkedActor, ChunkedProgramPolicy, build_policy

    torch.manual_seed(0)
    actor = ChunkedActor(3 + 4, 2, [16], horizon=4, execute=3, obs_normalization=True)
    actor.normalizer.update(torch.randn(64, 7) * 2 + 0.5)
    layout = Layout({"policy": (Term("x", 3), Term("prev", 4, source="history", history_len=2, history_init=0.1))},
                    (ActionTerm("u", 2),), 10.0)
    x = torch.randn(32, 7)
    meta = write_bundle(actor, layout, x.numpy(), tmp_path / "b", "all")
    assert meta["policy"]["chunk"] == {"horizon": 4, "execute": 3} and meta["parity"]["passed"]
    assert meta["parity"]["c_vs_torch"] <= TOL
    runners = [load_bundle(tmp_path / "b", backend) for backend in ("onnx", "c")]
    for r in runners:
        assert r.forward(x.numpy()).shape == (32, 8)
    _fly_beside(actor, runners, steps=11, new_episode_at=7)
    # with temporal ensembling (the network every step, the kept chunks averaged) in both runners
    actor.ensemble = 0.3
    write_bundle(actor, layout, x.numpy(), tmp_path / "e", "all")
    _fly_beside(actor, [load_bundle(tmp_path / "e", backend) for backend in ("onnx", "c")], steps=9, new_episode_at=6)
    actor.ensemble = None
    # the bundle as a frozen base: a ChunkedProgramPolicy whose act queues like the actor's
    base = build_policy(load_base(str(tmp_path / "b"), 7, 2)["spec"])
    base.load_state_dict(load_base(str(tmp_path / "b"), 7, 2)["state"])
    assert isinstance(base, ChunkedProgramPolicy)
    actor.reset()
    for t in range(5):
        obs = torch.randn(3, 7)
        assert torch.allclose(base.act(obs), actor.act(obs), atol=TOL), t


def test_residual_over_a_chunked_base_exports_as_two_programs(tmp_path):
    """A residual over an action-chunked base: base.onnx gives the base's chunk, the runner's queue picks its action
    b, policy.onnx maps [obs, b] to the action. Parity of both programs; the runner acts as the torch policy step
    by step (queue, history, a new episode; ONNX and C) and reports the base's action for the safety filter."""
    from embodied.core.layout import ActionTerm
    from embodied.hardware.bundle import write_bundle
    from embodied.policies import ChunkedActor, ResidualActor
    from embodied.policies.actor_critic import policy_spec

    torch.manual_seed(1)
    base = ChunkedActor(3 + 4, 2, [16], horizon=4, execute=3, obs_normalization=True)
    base.normalizer.update(torch.randn(64, 7) * 2 + 0.5)
    residual = SquashedGaussianActor(7 + 2, 2, [16], obs_normalization=True)
    residual.normalizer.update(torch.randn(64, 9))
    # one scale and bound per action entry (the second as a gripper's would be: wide enough to flip a sign)
    actor = ResidualActor(policy_spec(base), policy_spec(residual), scale=[0.5, 1.5], limit=[0.3, 1.2])
    actor.base.load_state_dict(base.state_dict())
    actor.residual.load_state_dict(residual.state_dict())
    layout = Layout({"policy": (Term("x", 3), Term("prev", 4, source="history", history_len=2, history_init=0.1))},
                    (ActionTerm("u", 2),), 10.0)
    x = torch.randn(32, 7)
    meta = write_bundle(actor, layout, x.numpy(), tmp_path / "b", "all")
    assert meta["parity"]["passed"] and meta["parity"]["base_torch_vs_onnxruntime"] <= TOL
    assert meta["policy"]["base"]["chunk"] == {"horizon": 4, "execute": 3} and "chunk" not in meta["policy"]
    assert meta["policy"]["residual"] == {"output": "base_action", "scale": [0.5, 1.5], "limit": [0.3, 1.2]}
    assert max(meta["parity"]["c_vs_torch"], meta["parity"]["base_c_vs_torch"]) <= TOL and "base.onnx" in meta["files"]
    runners = [load_bundle(tmp_path / "b", backend) for backend in ("onnx", "c")]
    # forward: the base's first action of a fresh chunk, then the residual
    with torch.no_grad():
        b = base.chunk(x)[:, 0]
        ref = actor.combine(b, actor.residual.act(torch.cat([x, b], 1)))
    for r in runners:
        assert np.abs(r.forward(x.numpy()) - ref.numpy()).max() <= TOL
    assert (ref - b).abs().max() > 0.05  # the residual moves the action: the test sees both programs

    class Beside:  # a runner, and its base action against the torch base's, every step
        def __init__(self, runner):
            self.runner, self.backend = runner, runner.backend

        def reset(self):
            self.runner.reset()

        def act(self, state):
            a = self.runner.act(state)
            assert np.abs(self.runner.base_action - base_seen[-1]).max() <= TOL
            return a

    base_seen = []
    combine = actor.combine
    actor.combine = lambda b, r: (base_seen.append(b[0].numpy().copy()), combine(b, r))[1]
    _fly_beside(actor, [Beside(r) for r in runners], steps=11, new_episode_at=7)
    # wider networks: the residual stage's 64-input layers in the base's 84-float scratch buffers (GCC's loop
    # analysis once failed -Werror there on a remainder loop that never runs)
    wide = ResidualActor(policy_spec(ChunkedActor(7, 2, [64, 64], horizon=42, execute=4)),
                         policy_spec(SquashedGaussianActor(9, 2, [64, 64])), scale=0.5, limit=0.3)
    assert write_bundle(wide, layout, x.numpy(), tmp_path / "w", "c")["parity"]["passed"]
    # with the base's temporal ensembling (its network every step, the kept chunks averaged)
    actor.base.ensemble = 0.3
    write_bundle(actor, layout, x.numpy(), tmp_path / "e", "all")
    _fly_beside(actor, [Beside(load_bundle(tmp_path / "e", backend)) for backend in ("onnx", "c")], steps=9,
                new_episode_at=6)
