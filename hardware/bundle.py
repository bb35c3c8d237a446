"""The deploy bundle: ``policy.onnx`` (the deterministic action path, normalization inside, equivariant
layers as their folded matmuls; a policy that samples takes its standard-normal noise as an input, drawn by the
runner), ``bundle.json`` (layout, task, config hash, commits, file hashes,
parity), ``observations.npy`` (the recorded observations parity was checked on), and with the C format
``policy.c`` / ``policy.h`` / ``firmware.c``.

``export_run`` writes one from a run; ``load_bundle`` reads one back as a ``PolicyRunner`` whose
``act(state)`` keeps the action history the layout declares, backed by onnxruntime or by the C build."""

from __future__ import annotations

import ctypes
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embodied.core.errors import UserError
from embodied.core.layout import Layout
from embodied.policies.residual import per_dimension

FORMAT = 1
_clip = (np._core if hasattr(np, "_core") else np.core).umath.clip  # the ufunc: np.clip's wrapper costs ~2 us
_LO, _HI = np.float32(-1.0), np.float32(1.0)
PARITY_TOL = 1e-5
FORMATS = ("onnx", "c", "all")
CFILES = ("policy.c", "policy.h", "firmware.c")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---- export ------------------------------------------------------------------------------------------
@torch.no_grad()
def record_observations(policy, cfg, count: int = 1024, num_envs: int = 16, seed: int = 12345) -> np.ndarray:
    """``[>= count, obs_dim]`` policy observations the task produces while the policy flies it."""
    from embodied.evaluate import make_eval_env

    env = make_eval_env(cfg, num_envs=num_envs, device="cpu")
    obs, _ = env.reset(seed=seed)
    rows = [obs["policy"].clone()]
    while sum(r.shape[0] for r in rows) < count:
        obs, *_ = env.step(policy.act(obs["policy"]))
        rows.append(obs["policy"].clone())
    return torch.cat(rows).numpy().astype(np.float32)


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def export_run(run_dir: Path, out: Path | None = None, fmt: str = "all", count: int = 1024) -> dict:
    """Write the bundle of ``run_dir``'s policy (latest checkpoint) into ``out`` (default ``run_dir/bundle``);
    returns the bundle's metadata. Parity failures raise ``UserError`` after the report is written."""
    from embodied.checkpoint import load_checkpoint, policy_from_checkpoint
    from embodied.config import config_from_dict, to_yaml
    from embodied.evaluate import make_eval_env, source_task

    _check_format(fmt)
    run_dir = Path(run_dir)
    ckpt = load_checkpoint(run_dir)
    cfg = config_from_dict(ckpt["config"])
    policy = policy_from_checkpoint(ckpt, run_dir)
    env = make_eval_env(cfg, num_envs=1, device="cpu")
    layout = env.layout()
    layout.check({g: s.shape for g, s in env.single_observation_space.spaces.items()}, env.single_action_space.shape)
    out = Path(out) if out else run_dir / "bundle"
    _writable(out)
    if layout.images("policy"):
        count = min(count, 64)  # parity on 64 camera frames keeps an image policy's bundle a few MB
    obs = record_observations(policy, cfg, count)
    run_prov = run_dir / "provenance.json"
    source = {"dir": str(run_dir.resolve()), "step": int(ckpt["step"]),
              "config_sha256": hashlib.sha256(to_yaml(cfg).encode()).hexdigest(),
              "provenance": json.loads(run_prov.read_text()) if run_prov.exists() else None}
    # the task the policy deploys to: a policy trained in a learned model (wm:<task>) flies the real task
    return write_bundle(policy.actor, layout, obs, out, fmt, source_task(cfg)[0], source)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write the bundle to {out}: {e.strerror or e}") from None


@torch.no_grad()
def write_bundle(actor: torch.nn.Module, layout: Layout, obs: np.ndarray, out: Path, fmt: str = "all",
                 task: str | None = None, source: dict | None = None) -> dict:
    """The bundle of any exportable actor: ONNX (and C) from its program, parity on ``obs`` against
    ``actor.act``, metadata. ``source`` says where the policy came from (a run: dir, step, config hash)."""
    from embodied.policies.export import residual_op
    from embodied.vla.build import instruction_term

    _check_format(fmt)
    out = Path(out)
    _writable(out)
    actor = actor.eval()
    obs = np.ascontiguousarray(obs, np.float32)
    text = instruction_term(layout)
    if text is not None:  # a language-conditioned policy: ONNX with the instruction as its own input
        return _write_instruction_bundle(actor, layout, obs, out, fmt, task, source, text)
    np.save(out / "observations.npy", obs)
    parity = {"observations": int(obs.shape[0]), "tolerance": PARITY_TOL}
    prog = _write_onnx(actor, layout, obs, out, f"embodied policy of {task}", parity)
    parity["torch_vs_onnxruntime"] = float(np.abs(prog.onnx_out - prog.ref).max())
    # a residual over a base: its bound, which the deploy safety filter enforces against the base's action
    op = residual_op(prog.ops)
    residual = {"scale": per_dimension(op.attrs["scale"]), "limit": per_dimension(op.attrs["limit"])} \
        if op is not None else None
    c_info, files = None, prog.files
    if layout.images("policy"):
        if fmt == "c":
            raise UserError("policies with camera images export to ONNX only (--format onnx); the C emitter "
                            "and the serial firmware carry state vectors")
        c_info = {"skipped": "camera-image policy: ONNX only"}
    elif fmt in ("c", "all"):
        c_info, files = _write_c(prog, layout, obs, out, parity), [*prog.files, *CFILES]
    parity["passed"] = all(v <= PARITY_TOL for k, v in parity.items() if "_vs_" in k)
    policy = {"input": "obs_base" if prog.base else "obs", "output": "action", "obs_dim": prog.obs_dim,
              "act_dim": layout.action_size, "actor": type(actor).__name__, "ops": [op.kind for op in prog.ops],
              **({"residual": {"output": "base_action", **residual}} if residual else {}),
              **({"chunk": prog.chunk} if prog.chunk else {}), **({"base": prog.base} if prog.base else {})}
    failure = f"parity failed (tolerance {PARITY_TOL}): " + ", ".join(
        f"{k} {v:.2e}" for k, v in parity.items() if "_vs_" in k)
    return _finish(out, layout, task, source, policy, parity, c_info, files, failure)


@dataclass
class _Program:
    """What ``_write_onnx`` wrote: the actor's program (``ops`` on ``obs_dim`` inputs), its outputs on the recorded
    observations (``ref`` from torch, ``onnx_out`` from onnxruntime), the chunk it gives, and for a residual over an
    action-chunked base that base's program (``base_ops``), metadata (``base``) and chunks."""

    ops: list
    obs_dim: int
    ref: np.ndarray
    onnx_out: np.ndarray
    files: list[str]
    chunk: dict | None = None
    base: dict | None = None
    base_ops: list | None = None
    chunks: torch.Tensor | None = None


def _write_onnx(actor, layout: Layout, obs: np.ndarray, out: Path, doc: str, parity: dict) -> _Program:
    import onnx

    from embodied.hardware.onnx_export import program_to_onnx
    from embodied.policies.export import chunk_spec, fold, program, residual_program
    from embodied.policies.residual import ResidualActor

    x = torch.from_numpy(obs)
    files = ["policy.onnx", "observations.npy"]
    if isinstance(actor, ResidualActor) and chunk_spec(actor.base) is not None:
        # a residual over an action-chunked base is two programs: base.onnx gives the base's chunk, the runner's
        # queue picks its action b, policy.onnx maps [obs, b] to the action (parity on b = each chunk's first)
        base_ops, obs_dim = program(actor.base)
        onnx.save(program_to_onnx(fold(base_ops), obs_dim, doc=f"{doc}: the base's chunk"), str(out / "base.onnx"))
        chunks = actor.base.chunk(x).reshape(obs.shape[0], -1)
        base_out = _session(out / "base.onnx").run(None, {"obs": obs})[0]
        parity["base_torch_vs_onnxruntime"] = float(np.abs(base_out - chunks.numpy()).max())
        b = chunks[:, :layout.action_size]
        ref = actor.combine(b, actor.residual.act(torch.cat([x, b], 1))).numpy()
        ops, in_dim = residual_program(actor)
        onnx.save(program_to_onnx(fold(ops), in_dim, doc=doc, input_name="obs_base"), str(out / "policy.onnx"))
        onnx_out = _session(out / "policy.onnx").run(None, {"obs_base": torch.cat([x, b], 1).numpy()})[0]
        base = {"file": "base.onnx", "input": "obs", "output": "action", "chunk": chunk_spec(actor.base),
                "ops": [op.kind for op in base_ops]}
        # policy.onnx gives one action; the base's chunk is queued
        return _Program(ops, obs_dim, ref, onnx_out, files + ["base.onnx"], None, base, base_ops, chunks)
    ops, obs_dim = program(actor)
    chunk = chunk_spec(actor)  # an action-chunked policy: the program gives the chunk, the runner keeps the queue
    ref = actor.chunk(x).reshape(obs.shape[0], -1).numpy() if chunk else actor.act(x).numpy()
    onnx.save(program_to_onnx(fold(ops), obs_dim, doc=doc), str(out / "policy.onnx"))
    onnx_out = _session(out / "policy.onnx").run(None, {"obs": obs})[0]
    return _Program(ops, obs_dim, ref, onnx_out, files, chunk)


def _write_c(prog: _Program, layout: Layout, obs: np.ndarray, out: Path, parity: dict) -> dict:
    """``policy.c`` / ``policy.h`` / ``firmware.c`` (``CFILES``) of the program, compiled, parity against ONNX and
    torch; the C section of the metadata (object size, whether it fits 64 kB of flash)."""
    from embodied.hardware import protocol
    from embodied.hardware.codegen import compile_object, emit_c, size_report
    from embodied.hardware.firmware import firmware_source

    widest = 4 * max(layout.robot_size("policy"), layout.action_size)
    if widest > protocol.MAX_PAYLOAD:
        raise UserError(f"the firmware's serial frames carry at most {protocol.MAX_PAYLOAD // 4} floats; this "
                        f"policy's state or action needs {widest // 4} (export --format onnx)")
    base = {"ops": prog.base_ops, "chunk": prog.base["chunk"]} if prog.base else None
    header, source_c = emit_c(prog.ops, prog.obs_dim, layout, chunk=prog.chunk, base=base)
    (out / "policy.h").write_text(header)
    (out / "policy.c").write_text(source_c)
    (out / "firmware.c").write_text(firmware_source(layout))
    c_policy = CPolicy.build(out)
    c_out = c_policy.forward(obs)
    if prog.base is not None:  # every action of the base's chunks, not only the first one forward uses
        parity["base_c_vs_torch"] = float(np.abs(c_policy.base_chunk(obs) - prog.chunks.numpy()).max())
    parity["c_vs_onnxruntime"] = float(np.abs(c_out - prog.onnx_out).max())
    parity["c_vs_torch"] = float(np.abs(c_out - prog.ref).max())
    size = size_report(compile_object(out / "policy.c", out / "build" / "policy.o"))
    return {"size": size, "fits_64k_flash": bool(size and size["flash"] <= 64 * 1024)}


def _finish(out: Path, layout: Layout, task, source, policy: dict, parity: dict, c_info, files: list[str],
            failure: str) -> dict:
    """``parity.json`` and ``bundle.json`` (every file's hash); a failed parity raises ``failure`` after both are
    written (the report stays for the user to read)."""
    from embodied.provenance import code_commit, versions

    (out / "parity.json").write_text(json.dumps(parity, indent=1))
    meta = {
        "format": FORMAT, "task": task, "layout": layout.to_dict(), "policy": policy, "run": source,
        "exported": {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": code_commit(),
                     **versions("torch", "onnx", "onnxruntime")},
        "parity": parity, "c": c_info,
        "files": {name: sha256(out / name) for name in files},
    }
    (out / "bundle.json").write_text(json.dumps(meta, indent=1))
    if not parity["passed"]:
        raise UserError(f"{failure}; report in {out / 'parity.json'}")
    return meta


def _write_instruction_bundle(actor, layout: Layout, obs: np.ndarray, out: Path, fmt: str, task, source,
                              text: list[int]) -> dict:
    """``write_bundle`` of a policy with an instruction term (``embodied.vla.export``): ``policy.onnx`` takes the
    observation without it (``obs``) and the instruction's embedding (``instruction``); ``instructions.npy`` holds
    the embeddings of the instructions the task knows (their strings in ``bundle.json``), so the deploy side needs
    no text encoder for them. ONNX only."""
    from embodied.policies.sampled import SampledActor
    from embodied.vla.export import export_onnx, split_instruction
    from embodied.vla.text import encode

    if fmt == "c":
        raise UserError("instruction-conditioned policies export to ONNX only (--format onnx); the C emitter and "
                        "the serial firmware carry state vectors")
    np.save(out / "observations.npy", obs)
    export_onnx(actor, text, obs.shape[1], out / "policy.onnx")
    o, t = split_instruction(obs, text)
    feeds, noise = {"obs": o, "instruction": t}, None
    if isinstance(actor, SampledActor):  # a policy that samples: parity on one fixed draw of its noise
        feeds["noise"] = np.random.default_rng(0).standard_normal((obs.shape[0], actor.act_dim)).astype(np.float32)
        ref = actor(torch.from_numpy(obs), torch.from_numpy(feeds["noise"])).numpy()
        noise = {"input": "noise", "temperature": actor.temperature, "seed": actor.seed}
    else:
        ref = actor(torch.from_numpy(obs)).numpy()
    onnx_out = _session(out / "policy.onnx").run(None, feeds)[0]
    parity = {"observations": int(obs.shape[0]), "tolerance": PARITY_TOL,
              "torch_vs_onnxruntime": float(np.abs(onnx_out - ref).max())}
    parity["passed"] = parity["torch_vs_onnxruntime"] <= PARITY_TOL
    quantum = getattr(actor, "action_quantum", None)
    if quantum is not None:  # binned actions: the most likely bin of two near-equal logits may differ by one
        diff = np.abs(onnx_out - ref)
        parity["exact_fraction"] = float((diff <= PARITY_TOL).mean())
        parity["max_bins_apart"] = float((diff / quantum.numpy()).max())
        parity["passed"] = parity["exact_fraction"] >= 0.99 and parity["max_bins_apart"] <= 1.001
    instructions = list(layout.extras.get("instructions", []))
    np.save(out / "instructions.npy", encode(instructions) if instructions else np.zeros((0, text[1]), np.float32))
    policy = {"input": "obs", "inputs": list(feeds), "output": "action",
              "obs_dim": obs.shape[1] - int(text[1]), "instruction_dim": int(text[1]),
              "act_dim": layout.action_size, "actor": type(actor).__name__, "instructions": instructions,
              **({"noise": noise} if noise else {})}
    failure = (f"parity failed (tolerance {PARITY_TOL}; binned actions: 99% exact, one bin at most): "
               f"torch_vs_onnxruntime {parity['torch_vs_onnxruntime']:.2e}")
    return _finish(out, layout, task, source, policy, parity, {"skipped": "instruction-conditioned policy: ONNX only"},
                   ["policy.onnx", "observations.npy", "instructions.npy"], failure)


# ---- load --------------------------------------------------------------------------------------------
def read_bundle(path: Path, check_parity: bool = True) -> dict:
    """``bundle.json`` of a bundle directory, its files checked against their hashes."""
    path = Path(path)
    meta_path = path / "bundle.json" if path.is_dir() else path
    try:
        meta = json.loads(meta_path.read_text())
        files = dict(meta["files"])
        meta["layout"] = Layout.from_dict(meta["layout"])
        int(meta["policy"]["obs_dim"]), int(meta["policy"]["act_dim"])
    except FileNotFoundError:
        raise UserError(f"no deploy bundle at {path} (bundle.json missing)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError) as e:
        raise UserError(f"corrupt bundle {meta_path}: {type(e).__name__}: {e}") from None
    if check_parity and not (meta.get("parity") or {}).get("passed", False):
        report = meta_path.parent / "parity.json"
        raise UserError(f"bundle {meta_path.parent} failed its parity check at export ({report}); it is kept for "
                        "inspection, not for flight")
    if meta.get("format") != FORMAT:
        raise UserError(f"bundle {meta_path} has format {meta.get('format')}, this version reads {FORMAT}")
    for name, digest in files.items():
        f = meta_path.parent / name
        if not f.exists() or sha256(f) != digest:
            raise UserError(f"corrupt bundle {meta_path.parent}: {name} is missing or does not match its hash")
    meta["dir"] = meta_path.parent
    return meta


class CPolicy:
    """The generated C, built as a shared library and called through ctypes."""

    def __init__(self, lib_path: Path, obs_dim: int, act_dim: int, state_dim: int, out_dim: int | None = None,
                 horizon: int = 1):
        self.lib = ctypes.CDLL(str(lib_path))
        # raw addresses: ctypes' per-call conversions cost us (policy_base_chunk: a residual over a chunked base only)
        for name in ("policy_forward", "policy_step", "policy_base_chunk"):
            fn = getattr(self.lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], None
        self.obs_dim, self.act_dim, self.state_dim = obs_dim, act_dim, state_dim
        self.horizon = horizon  # actions per chunk of a chunked policy (or base)
        self.out_dim = out_dim or act_dim  # what forward writes: a chunked policy's whole chunk
        self._state = np.zeros(state_dim, np.float32)
        self._out = np.zeros(act_dim, np.float32)
        self._state_p, self._out_p = self._state.ctypes.data, self._out.ctypes.data
        self._step = self.lib.policy_step
        self._base = getattr(self.lib, "policy_base_action", None)  # a residual over a base only
        if self._base is not None:
            self._base.argtypes, self._base.restype = [ctypes.c_void_p], None

    @classmethod
    def build(cls, bundle_dir: Path) -> CPolicy:
        """Compile ``policy.c`` (cached by source hash under ``build/``)."""
        from embodied.hardware.codegen import build_key, compile_shared, source_hash

        src = Path(bundle_dir) / "policy.c"
        header = (Path(bundle_dir) / "policy.h").read_text()
        key = source_hash(src.read_text(), header, build_key())[:16]  # a bundle copied to another machine rebuilds
        lib = Path(bundle_dir) / "build" / f"libpolicy_{key}.so"
        try:
            if not lib.exists():
                lib.parent.mkdir(exist_ok=True)
                tmp = lib.with_suffix(".tmp.so")
                compile_shared(src, tmp, ["-I", str(bundle_dir)])
                tmp.replace(lib)
        except OSError as e:
            raise UserError(f"cannot build the C policy in {lib.parent}: {e.strerror or e}") from None

        def define(name, default=None):
            lines = header.splitlines()
            return int(next((line.split()[2] for line in lines if line.startswith(f"#define POLICY_{name} ")),
                            default))

        return cls(lib, define("OBS_DIM"), define("ACT_DIM"), define("STATE_DIM"), define("OUT_DIM", 0),
                   define("CHUNK", 1))

    def forward(self, obs: np.ndarray) -> np.ndarray:
        return self._rows(self.lib.policy_forward, obs, self.out_dim)

    def base_chunk(self, obs: np.ndarray) -> np.ndarray:
        """The chunks ``[B, horizon * act_dim]`` of a residual's action-chunked base (``policy_base_chunk``)."""
        return self._rows(self.lib.policy_base_chunk, obs, self.horizon * self.act_dim)

    def _rows(self, fn, obs: np.ndarray, width: int) -> np.ndarray:
        """``fn(row in, row out)`` over the rows of ``obs [B, obs_dim]``: ``[B, width]``."""
        obs = np.ascontiguousarray(obs, np.float32).reshape(-1, self.obs_dim)
        out = np.empty((obs.shape[0], width), np.float32)
        row_in, row_out = obs.strides[0], out.strides[0]
        for r in range(obs.shape[0]):
            fn(obs.ctypes.data + r * row_in, out.ctypes.data + r * row_out)
        return out

    def reset(self) -> None:
        self.lib.policy_reset()

    def step(self, state: np.ndarray) -> np.ndarray:
        self._state[:] = state
        self._step(self._state_p, self._out_p)
        return self._out.copy()

    def base_action(self, out: np.ndarray) -> None:
        """The base policy's action of the last call, into ``out`` (a residual bundle's C)."""
        self._base(out.ctypes.data)


class PolicyRunner:
    """``act(state) -> action``: the robot's state (the layout's robot terms of the policy group, in order)
    in, the normalized action out; the runner keeps the history and average terms. ``forward(obs)`` runs full
    observations ``[B, obs_dim]`` without touching the history. A residual bundle's runner also keeps the base
    policy's action of the last ``act`` in ``base_action`` (None otherwise) and its bound in ``residual_limit``:
    what the deploy safety filter bounds ``|action - base_action|`` with."""

    def __init__(self, meta: dict, backend: str = "onnx"):
        self.meta, self.backend = meta, backend
        self.layout: Layout = meta["layout"]
        self.obs_dim, self.act_dim = int(meta["policy"]["obs_dim"]), int(meta["policy"]["act_dim"])
        # a language-conditioned bundle: the instruction's embedding is an input of its own (``set_instruction``)
        self.instruction_dim = int(meta["policy"].get("instruction_dim", 0))
        self.instructions = list(meta["policy"].get("instructions", []))
        self._instruction = np.zeros((1, self.instruction_dim), np.float32)
        self._has_instruction = False
        # a policy that samples: its standard-normal noise, drawn here every step (reseeded by ``reset``)
        self.noise = meta["policy"].get("noise")
        self._noise = np.zeros((1, self.act_dim), np.float32) if self.noise else None
        self._rng = np.random.default_rng(int(self.noise["seed"])) if self.noise else None
        if self.instruction_dim and backend != "onnx":
            raise UserError(f"bundle {meta['dir']} is instruction-conditioned: it runs on onnx only")
        self.state_dim = self.layout.robot_size("policy")
        # a residual over an action-chunked base: base.onnx gives the base's chunk, its queue the base's action b,
        # policy.onnx reads [obs, b] (``_input``; the observation a view of its first part)
        self.base = meta["policy"].get("base")
        self._input = np.zeros((1, self.obs_dim + (self.act_dim if self.base else 0)), np.float32)
        self._obs = self._input[:, :self.obs_dim]
        residual = meta["policy"].get("residual")
        self.residual_limit = per_dimension(residual["limit"]) if residual else None  # a number, or one per entry
        self.base_action = np.zeros(self.act_dim, np.float32) if residual else None
        # an action-chunked policy (or base): each run gives ``horizon`` actions, ``act`` executes ``execute`` of them
        chunk = (self.base or meta["policy"]).get("chunk") or {}
        self.horizon, self.execute = int(chunk.get("horizon", 1)), int(chunk.get("execute", 1))
        self._queue = np.zeros((self.horizon, self.act_dim), np.float32) if chunk else None
        self._next = self.execute
        # temporal ensembling (``ChunkQueue.ensemble``): the last ``horizon`` chunks, newest first, run every step
        self.ensemble = chunk.get("ensemble")
        if self.ensemble is not None:
            self._past = np.zeros((self.horizon, self.horizon, self.act_dim), np.float32)
            self._weights = np.exp(float(self.ensemble) * np.arange(self.horizon, dtype=np.float32))
            self._ages = np.arange(self.horizon)
            self._valid = 0
        self._views()
        self._open(backend, ["action", "base_action"] if residual else ["action"], bool(residual))
        self.reset()

    def _views(self) -> None:
        """Where the robot's state goes in the observation (runs of consecutive terms merged), the history and
        average terms' slots: views of the one observation buffer, made once."""
        slices = self.layout.slices("policy", skip_sources=("instruction",))
        runs, self._history, averages, s = [], [], [], 0
        for t in self.layout.terms("policy"):
            if t.source == "instruction":
                continue
            sl = slices[t.name]
            if t.source == "average":
                averages.append((sl, slices[t.average_of], t.average_decay))
            elif t.source == "robot":
                if runs and runs[-1][0].stop == sl.start:
                    runs[-1] = (slice(runs[-1][0].start, sl.stop), slice(runs[-1][1].start, s + t.size))
                else:
                    runs.append((sl, slice(s, s + t.size)))
                s += t.size
            else:
                self._history.append((sl, t.history_init))
        o, k = self._obs[0], self.act_dim
        self._robot = [(o[dst], src) for dst, src in runs]
        self._whole_state = len(runs) == 1
        self._shift = [(o[sl.start:sl.stop - k], o[sl.start + k:sl.stop], o[sl.stop - k:sl.stop])
                       for sl, _ in self._history]
        # average terms: (the average's slots, the averaged robot term's, decay, 1 - decay), kept as the task keeps them
        self._averages = [(o[dst], o[src], np.float32(d), np.float32(1.0 - d)) for dst, src, d in averages]
        self._average_first = True

    def _open(self, backend: str, outputs: list[str], residual: bool) -> None:
        """The backend's sessions (onnxruntime, fed straight from the observation buffer) or the C build."""
        meta = self.meta
        if backend == "onnx":
            self.session = _session(meta["dir"] / "policy.onnx")
            feeds = {"obs_base": self._input} if self.base else \
                {"obs": self._obs, "instruction": self._instruction} if self.instruction_dim else {"obs": self._obs}
            if self._noise is not None:
                feeds["noise"] = self._noise
            self._run = _fast_run(self.session, outputs, feeds)
            if self.base:
                self.base_session = _session(meta["dir"] / self.base["file"])
                self._run_base = _fast_run(self.base_session, [self.base["output"]], {"obs": self._obs})
            self.c = None
        elif backend == "c":
            if "policy.c" not in meta["files"]:
                raise UserError(f"bundle {meta['dir']} has no C source; export it with --format c or all")
            self.c = CPolicy.build(meta["dir"])
            if residual and self.c._base is None:
                raise UserError(f"bundle {meta['dir']}: a residual policy whose C has no policy_base_action; export "
                                "it again")
        else:
            raise UserError(f"bundle backend must be onnx or c, got {backend!r}")

    def reset(self) -> None:
        for sl, init in self._history:
            self._obs[0, sl] = init
        self._next = self.execute  # a chunked policy looks again at the episode's first step
        self._average_first = True  # an average starts at the first value the robot reports
        self._valid = 0  # an ensembling one forgets the last episode's chunks
        if self.c is not None:
            self.c.reset()
        if self._rng is not None:  # every episode draws the same noise, as an evaluation's does
            self._rng = np.random.default_rng(int(self.noise["seed"]))

    def set_instruction(self, text: str, encoder=None) -> None:
        """The instruction the policy follows: one of the bundle's known instructions (``instructions``), or any
        text where ``encoder`` (an ``embodied.vla.text.TextEncoder``: the exported MiniLM) embeds it."""
        if not self.instruction_dim:
            raise UserError("this bundle's policy takes no instruction")
        if text not in self.instructions and encoder is not None:
            self._instruction[0] = encoder.encode([text])[0]
            self._has_instruction = True
            return
        if text not in self.instructions:
            known = "; ".join(repr(s) for s in self.instructions[:6]) + (" ..." if len(self.instructions) > 6 else "")
            raise UserError(f"instruction {text!r} is not one the bundle knows ({len(self.instructions)}: {known})")
        table = np.load(self.meta["dir"] / "instructions.npy")
        self._instruction[0] = table[self.instructions.index(text)]
        self._has_instruction = True

    def forward(self, obs: np.ndarray, instruction: np.ndarray | None = None) -> np.ndarray:
        """The policy's network on full observations ``[B, obs_dim]``: actions ``[B, act_dim]``, or for a chunked
        policy its chunks ``[B, horizon * act_dim]`` (action after action); no history or queue is touched."""
        obs = np.ascontiguousarray(obs, np.float32).reshape(-1, self.obs_dim)
        if self.c is not None:
            return self.c.forward(obs)
        if self.base:  # the base's action: the first of a chunk predicted now
            b = self.base_session.run(None, {"obs": obs})[0][:, :self.act_dim]
            return self.session.run(None, {"obs_base": np.concatenate([obs, b], 1)})[0]
        if self.instruction_dim:
            inst = np.broadcast_to(self._instruction if instruction is None else instruction,
                                   (obs.shape[0], self.instruction_dim))
            feeds = {"obs": obs, "instruction": np.ascontiguousarray(inst, np.float32)}
            if self._rng is not None:
                feeds["noise"] = self._rng.standard_normal((obs.shape[0], self.act_dim)).astype(np.float32)
            return self.session.run(None, feeds)[0]
        return self.session.run(None, {"obs": obs})[0]

    def act(self, state: np.ndarray) -> np.ndarray:
        if self.instruction_dim and not self._has_instruction:
            raise UserError("this bundle's policy follows an instruction: give one (set_instruction, or "
                            "embodied deploy --instruction)")
        if self.c is not None:
            a = self.c.step(state)
            if self.base_action is not None:
                self.c.base_action(self.base_action)
            return a
        if self._whole_state:
            np.copyto(self._robot[0][0], state)
        else:
            for dst, src in self._robot:
                np.copyto(dst, state[src])
        for avg, value, d, w in self._averages:
            if self._average_first:
                np.copyto(avg, value)
            else:
                avg *= d
                avg += w * value
        self._average_first = False
        if self._noise is not None:
            self._noise[0] = self._rng.standard_normal(self.act_dim)
        if self.base:  # the base's action from its chunk queue, then the residual on [obs, b]
            self._input[0, self.obs_dim:] = self._queued(self._run_base)
            out = self._run()
            a = out[0][0]
        elif self._queue is None:
            out = self._run()
            a = out[0][0]
        else:
            a = self._queued(self._run)
        if self.base_action is not None:
            np.copyto(self.base_action, out[1][0])
        for older, newer, last in self._shift:  # the history holds the commanded action clipped to [-1, 1]
            np.copyto(older, newer)  # overlapping: numpy copies as if through a temporary
            _clip(a, _LO, _HI, out=last)
        return a


    def _queued(self, run) -> np.ndarray:
        """The action of a chunked program (``run()``'s first output is a chunk) from the queue."""
        if self.ensemble is not None:  # every step: this step's predictions of the kept chunks, weighted by age
            self._past[1:] = self._past[:-1].copy()
            self._past[0].reshape(-1)[:] = run()[0][0]
            self._valid = min(self._valid + 1, self.horizon)
            k, w = self._ages[:self._valid], self._weights[:self._valid]
            return (w[:, None] * self._past[k, k]).sum(0) / w.sum()
        if self._next >= self.execute:  # run the network only when the executed part of the last chunk is spent
            self._queue.reshape(-1)[:] = run()[0][0]
            self._next = 0
        a = self._queue[self._next].copy()
        self._next += 1
        return a


def _fast_run(session, outputs: list[str], feeds: dict):
    """``run()`` of an onnxruntime session on fixed output names and input buffers. InferenceSession.run checks its
    arguments and then calls ``_sess.run``; the runner's arguments are fixed and checked here once (the public call
    where a future onnxruntime lacks the attribute)."""
    import functools

    sess = getattr(session, "_sess", None)
    if sess is not None and hasattr(sess, "run"):
        import onnxruntime as ort

        return functools.partial(sess.run, outputs, feeds, ort.RunOptions())
    return functools.partial(session.run, outputs, feeds)


def load_bundle(path, backend: str = "onnx") -> PolicyRunner:
    """A bundle directory (or its ``bundle.json``) as a runner backed by onnxruntime or the C build."""
    return PolicyRunner(read_bundle(Path(path)), backend)
