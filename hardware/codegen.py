"""Dependency-free C99 from a policy program (``embodied.policies.export``): static const float32
weights, no malloc, no stdio (``math.h`` only, for tanhf/expf), fixed static scratch buffers, and one
entry point that also keeps the action history the policy observes.

Why an emitter of our own rather than a generic ONNX-to-C generator: our policies are a handful of layer
types; ONNX only carries the equivariant layers as their folded matrices (the quadrotor actor is then
~110 KB of float32), while the program keeps their free parameters, which the loops here expand (each
shared weight stored once: ~4x smaller); and the entry point that keeps the action history and the
state/observation layout is ours to write either way.

The API (``policy.h``)::

    void policy_reset(void);                                  /* history to its reset value */
    void policy_forward(const float *obs, float *action);     /* full observation -> action */
    void policy_step(const float *state, float *action);      /* robot state -> action, keeps the history */
    void policy_base_action(float *out);                      /* a residual over a base only: the base's last action */
    void policy_base_chunk(const float *obs, float *chunk);   /* a residual over a chunked base only: its chunk */
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from embodied.core.errors import UserError
from embodied.core.layout import Layout
from embodied.policies.export import Op, residual_op

CFLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"]


def flit(v: float) -> str:
    """A C float literal of ``v`` rounded to float32, exact (9 significant digits round-trip a float32)."""
    if not np.isfinite(np.float32(v)):
        raise UserError(f"non-finite constant {v} in the policy")
    s = f"{float(np.float32(v)):.9g}"
    return (s if any(c in s for c in ".e") else s + ".0") + "f"


def _floats(a: np.ndarray) -> str:
    """A C initializer of float32 values, exact (9 significant digits round-trip a float32)."""
    a = np.asarray(a, np.float32)
    if a.ndim == 1:
        items = [flit(v) for v in a]
        lines = [", ".join(items[i:i + 8]) for i in range(0, len(items), 8)]
        return "{" + ",\n    ".join(lines) + "}"
    return "{" + ",\n".join(_floats(row) for row in a) + "}"


def _ints(a: np.ndarray) -> str:
    a = np.asarray(a)
    if a.ndim == 1:
        return "{" + ", ".join(str(int(v)) for v in a) + "}"
    return "{" + ", ".join(_ints(row) for row in a) + "}"


def _dims(shape) -> str:
    return "".join(f"[{d}]" for d in shape)


def _accumulate(y: str, wt: str, xs: str, n: int, out: int) -> str:
    """``y[o] += sum_i wt[i][o] xs[i]``: four inputs per pass over the outputs (the output loop vectorizes at
    -O2, and ``y`` is read and written a quarter as often as one input per pass), then the ``n % 4`` left. The
    remainder loop starts at its constant first index: started where the first loop left ``i``, GCC's loop analysis
    sized it by the scratch buffer's length and failed -Werror (aggressive-loop-optimizations) on a 64-input layer
    in an 84-float buffer."""
    head = (f"for (i = 0; i + 4 <= {n}; i += 4) {{\n"
            f"    const float x0 = {xs}[i], x1 = {xs}[i + 1], x2 = {xs}[i + 2], x3 = {xs}[i + 3];\n"
            f"    const float *w0 = {wt}[i], *w1 = {wt}[i + 1], *w2 = {wt}[i + 2], *w3 = {wt}[i + 3];\n"
            f"    for (o = 0; o < {out}; ++o) {y}[o] += w0[o] * x0 + w1[o] * x1 + w2[o] * x2 + w3[o] * x3;\n}}")
    if n % 4 == 0:
        return head
    return (head + f"\nfor (i = {n - n % 4}; i < {n}; ++i) {{ const float xi = {xs}[i]; const float *w = {wt}[i]; "
            f"for (o = 0; o < {out}; ++o) {y}[o] += w[o] * xi; }}")


class _Emitter:
    def __init__(self, obs_dim: int, tag: str = ""):
        self.tag = tag  # prefixes its constants and saved buffers (two programs in one source)
        self.decls: list[str] = []
        self.body: list[str] = []
        self.dims = [obs_dim]
        self.saved: list[tuple[str, int]] = []  # buffers of the save op: (name, length)

    def const(self, name: str, ctype: str, a: np.ndarray) -> None:
        init = _floats(a) if ctype == "float" else _ints(a)
        self.decls.append(f"static const {ctype} {name}{_dims(a.shape)} = {init};")

    def _per_entry(self, name: str, value) -> str:
        """The C expression of a constant that is one number (a literal) or one per entry (an array read at ``i``)."""
        if isinstance(value, (list, tuple)):
            self.const(name, "float", np.asarray(value, np.float32))
            return f"{name}[i]"
        return flit(float(value))

    def op(self, i: int, op: Op, x: str, y: str) -> None:
        a, n, b = op.arrays, self.dims[-1], self.body
        out = op.out_dim(n)
        p = f"{self.tag}L{i}_"
        if op.kind == "normalize":
            self.const(p + "MEAN", "float", a["mean"])
            self.const(p + "STD", "float", a["std"])
            c = float(op.attrs["clip"])
            b.append(f"for (i = 0; i < {n}; ++i) {{ float v = ({x}[i] - {p}MEAN[i]) / {p}STD[i]; "
                     f"{y}[i] = v < -{flit(c)} ? -{flit(c)} : (v > {flit(c)} ? {flit(c)} : v); }}")
        elif op.kind == "dense":  # weights stored [in][out]: the inner loop over outputs vectorizes at -O2
            self.const(p + "WT", "float", a["W"].T)
            self.const(p + "B", "float", a["b"])
            b.append(f"for (o = 0; o < {out}; ++o) {y}[o] = {p}B[o];\n" + _accumulate(y, p + "WT", x, n, out))
        elif op.kind in ("relu", "tanh", "elu"):
            expr = {"relu": f"{x}[i] > 0.0f ? {x}[i] : 0.0f", "tanh": f"tanhf({x}[i])",
                    "elu": f"{x}[i] > 0.0f ? {x}[i] : expm1f({x}[i])"}[op.kind]
            b.append(f"for (i = 0; i < {n}; ++i) {y}[i] = {expr};")
        elif op.kind == "clip":
            lo, hi = float(op.attrs["lo"]), float(op.attrs["hi"])
            b.append(f"for (i = 0; i < {n}; ++i) {y}[i] = {x}[i] < {flit(lo)} ? {flit(lo)} : "
                     f"({x}[i] > {flit(hi)} ? {flit(hi)} : {x}[i]);")
        elif op.kind == "slice":
            s0 = int(op.attrs["start"])
            b.append(f"for (i = 0; i < {out}; ++i) {y}[i] = {x}[i + {s0}];")
        elif op.kind == "save":  # a composite policy keeps a value for later ops (saved[k])
            name = f"{self.tag}saved{len(self.saved)}"
            self.decls.append(f"static float {name}[{n}];")
            self.saved.append((name, n))
            b.append(f"for (i = 0; i < {n}; ++i) {{ {name}[i] = {x}[i]; {y}[i] = {x}[i]; }}")
        elif op.kind == "concat_saved":
            name, m = self.saved[int(op.attrs["index"])]
            b.append(f"for (i = 0; i < {n}; ++i) {y}[{m} + i] = {x}[i];\n"
                     f"for (i = 0; i < {m}; ++i) {y}[i] = {name}[i];")
        elif op.kind == "load_saved":
            name, m = self.saved[int(op.attrs["index"])]
            b.append(f"for (i = 0; i < {m}; ++i) {y}[i] = {name}[i];")
        elif op.kind == "add_saved":
            name, _ = self.saved[int(op.attrs["index"])]
            b.append(f"for (i = 0; i < {n}; ++i) {y}[i] = {name}[i] + {x}[i];")
        elif op.kind == "residual_add":
            name, _ = self.saved[int(op.attrs["index"])]
            s, lim = (self._per_entry(p + k, op.attrs[key]) for k, key in (("SCALE", "scale"), ("LIMIT", "limit")))
            b.append(f"for (i = 0; i < {n}; ++i) {{ float r = {s} * {x}[i]; "
                     f"r = r < -{lim} ? -{lim} : (r > {lim} ? {lim} : r); "
                     f"float v = {name}[i] + r; {y}[i] = v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }}")
        elif op.kind == "group_lift":
            self._group_lift(p, a, x, y)
        elif op.kind == "group_dense":
            self._group_dense(p, a, x, y)
        elif op.kind == "group_project":
            self._group_project(p, a, x, y)
        else:
            raise UserError(f"the C emitter has no op {op.kind!r}")
        self.dims.append(out)

    def _group_lift(self, p: str, a: dict, x: str, y: str) -> None:
        """The equivariant lifting layer (input to one copy per group element):
        ``y[g c + j] = b[j] + sum_i W[j, i] (g x)[i]``, ``(g x)[i] = s[g, i] x[p[g, i]]``."""
        b = self.body
        G, (c, d) = a["p"].shape[0], a["W"].shape
        self.const(p + "WT", "float", a["W"].T)
        self.const(p + "B", "float", a["b"])
        self.const(p + "P", "unsigned short", a["p"])
        self.const(p + "S", "signed char", a["s"].astype(np.int8))
        b.append(f"for (g = 0; g < {G}; ++g) {{\n"
                 f"    float *yg = {y} + g * {c};\n"
                 f"    for (o = 0; o < {c}; ++o) yg[o] = {p}B[o];\n"
                 f"    for (i = 0; i < {d}; ++i) gx[i] = {p}S[g][i] * {x}[{p}P[g][i]];\n"
                 + _indent(_accumulate("yg", p + "WT", "gx", d, c)) + "\n}")
        self.gx = max(getattr(self, "gx", 0), d)

    def _group_dense(self, p: str, a: dict, x: str, y: str) -> None:
        """A group-equivariant dense layer: ``y[g co + o] = b[o] + sum_g' sum_i w[k[g, g'], o, i] x[g' ci + i]``."""
        b = self.body
        G, co, ci = a["w"].shape
        self.const(p + "WT", "float", a["w"].transpose(0, 2, 1))  # [G][c_in][c_out]
        self.const(p + "B", "float", a["b"])
        self.const(p + "K", "unsigned char", a["k"])
        b.append(f"for (g = 0; g < {G}; ++g) {{\n"
                 f"    float *yg = {y} + g * {co};\n"
                 f"    for (o = 0; o < {co}; ++o) yg[o] = {p}B[o];\n"
                 f"    for (h = 0; h < {G}; ++h) {{\n"
                 f"        const float *xh = {x} + h * {ci};\n"
                 + _indent(_accumulate("yg", f"{p}WT[{p}K[g][h]]", "xh", ci, co), 2) + "\n    }\n}")

    def _group_project(self, p: str, a: dict, x: str, y: str) -> None:
        """The projection to the action, averaged over the group: ``y[a] = 1/G sum_g s[g, a] (W x[g] + b)[p[g, a]]``."""
        b = self.body
        G, (A, c) = a["p"].shape[0], a["W"].shape
        self.const(p + "W", "float", a["W"])
        self.const(p + "B", "float", a["b"])
        self.const(p + "P", "unsigned char", a["p"])
        self.const(p + "S", "signed char", a["s"].astype(np.int8))
        b.append(f"for (o = 0; o < {A}; ++o) {y}[o] = 0.0f;\n"
                 f"for (g = 0; g < {G}; ++g) {{\n"
                 f"    for (o = 0; o < {A}; ++o) {{ float acc = {p}B[o]; "
                 f"for (i = 0; i < {c}; ++i) acc += {p}W[o][i] * {x}[g * {c} + i]; gx[o] = acc; }}\n"
                 f"    for (o = 0; o < {A}; ++o) {y}[o] += {p}S[g][o] * gx[{p}P[g][o]];\n}}\n"
                 f"for (o = 0; o < {A}; ++o) {y}[o] *= {flit(1.0 / G)};")
        self.gx = max(getattr(self, "gx", 0), A)


def _indent(text: str, levels: int = 1) -> str:
    return "\n".join("    " * levels + line for line in text.splitlines())


def _check_signs(ops: list[Op]) -> None:
    for op in ops:
        if "s" in op.arrays and not np.all(np.isin(op.arrays["s"], (-1.0, 1.0))):
            raise UserError("the C emitter stores group signs as +-1; this program has other values")


def _emit_program(ops: list[Op], in_dim: int, tag: str = "") -> tuple[_Emitter, str]:
    """The program's C, alternating between the two scratch buffers; and the buffer its result ends in."""
    e, bufs = _Emitter(in_dim, tag), ("buf_a", "buf_b")
    for i, op in enumerate(ops):
        e.op(i, op, "x" if i == 0 else bufs[(i - 1) % 2], bufs[i % 2])
    return e, bufs[(len(ops) - 1) % 2]


def emit_c(ops: list[Op], obs_dim: int, layout: Layout, prefix: str = "policy",
           chunk: dict | None = None, base: dict | None = None) -> tuple[str, str]:
    """``(header, source)`` of the program with the layout's action-history bookkeeping. With ``chunk``
    (``{"horizon": H, "execute": k}``, ``export.chunk_spec``) the program outputs ``H`` actions: ``forward`` writes
    them all and ``step`` keeps the queue, running the network every ``k``-th call.

    With ``base`` (``{"ops": ..., "chunk": ...}``: an action-chunked base under a residual, ``ops`` then the
    residual's program on ``[obs, b]``, ``export.residual_program``) the base's program is a static function whose
    chunks ``step`` queues (``chunk`` is the base's; ``{prefix}_base_chunk`` gives one); its action ``b`` and the
    observation go into ``ops``; ``forward`` takes ``b`` from a chunk predicted on the spot (its first action)."""
    _check_signs(ops)
    act_in = layout.action_size if base else 0  # the residual stage reads the base's action after the observation
    e, last = _emit_program(ops, obs_dim + act_in)
    width, out_dim = max(e.dims), e.dims[-1]
    q_dim, stage_def = out_dim, ""  # q_dim: a chunk's size, the queue's width
    if base:
        _check_signs(base["ops"])
        be, base_last = _emit_program(base["ops"], obs_dim, tag="BASE_")
        e.decls += be.decls
        if hasattr(be, "gx"):
            e.gx = max(getattr(e, "gx", 0), be.gx)
        width, q_dim, chunk = max(width, *be.dims), be.dims[-1], base["chunk"]
        stage_def = _program_function(f"void {prefix}_base_chunk(const float *x, float *out)", be, base_last, q_dim,
                                      "out")
    horizon, execute = (int(chunk["horizon"]), int(chunk["execute"])) if chunk else (1, 1)
    act_dim = q_dim // horizon
    if act_dim * horizon != q_dim or act_dim != layout.action_size or obs_dim != layout.group_size("policy") or \
            (base and out_dim != act_dim):
        raise UserError(f"the policy maps {obs_dim} -> {out_dim} ({horizon} action(s)), the layout says "
                        f"{layout.group_size('policy')} -> {layout.action_size}")
    base_decl, base_def = _base_action(ops, e, prefix, act_dim)
    c = _chunking(prefix, chunk, bool(base), horizon, execute, obs_dim, act_dim, out_dim, q_dim)
    state_dim = layout.robot_size("policy")
    P = prefix.upper()
    header = f"""/* Generated by embodied (hardware/codegen.py). C99, float32, no malloc, no stdio. */
#ifndef EMBODIED_{P}_H
#define EMBODIED_{P}_H

#define {P}_OBS_DIM {obs_dim}
#define {P}_STATE_DIM {state_dim}
#define {P}_ACT_DIM {act_dim}
#define {P}_OUT_DIM {out_dim}
{c["defs"]}
/* reset the action history{c["reset_doc"]} (call at the start of every episode) */
void {prefix}_reset(void);
/* full observation ({obs_dim} floats, the layout's order) -> {c["forward_doc"]} */
void {prefix}_forward(const float *obs, float *action);
/* robot state ({state_dim} floats: the layout's robot terms in order) -> action; appends the action to the
   history the next call observes{c["step_doc"]} */
void {prefix}_step(const float *state, float *action);
{base_decl}{c["base_decl"]}
#endif
"""
    assemble, hist_decl, push, resets = _observation(layout, act_dim)
    nl = "\n    "
    gx = f"\nstatic float gx[{e.gx}];" if hasattr(e, "gx") else ""
    fn_decl, staged_forward, stage_call = f"void {prefix}_forward", "", ""
    if base:  # ops is the residual stage; forward runs the base on the spot, then the stage
        fn_decl, stage_call = "static void residual_stage", "\n    residual_stage(obs, action);"
        staged_forward = (f"\nvoid {prefix}_forward(const float *x, float *action) {{\n"
                          f"    static float xb[{obs_dim + act_in}];\n    static float q[{q_dim}];\n    int i;\n"
                          f"    {prefix}_base_chunk(x, q);\n    for (i = 0; i < {obs_dim}; ++i) xb[i] = x[i];\n"
                          f"    for (i = 0; i < {act_dim}; ++i) xb[{obs_dim} + i] = q[i];\n"
                          f"    residual_stage(xb, action);\n}}\n")
    forward = _program_function(f"{fn_decl}(const float *x, float *action)", e, last, out_dim, "action")
    source = f"""/* Generated by embodied (hardware/codegen.py) from a policy program; do not edit.
   C99, float32, static const weights, no malloc, no stdio. */
#include <math.h>
#include "{prefix}.h"

{chr(10).join(e.decls)}

static float buf_a[{width}];
static float buf_b[{width}];{gx}
{chr(10).join(hist_decl)}
{c["state"]}{stage_def}
{forward}{staged_forward}
void {prefix}_reset(void) {{
    int i;
    (void)i;
    {nl.join(resets)}{c["reset"]}
}}

void {prefix}_step(const float *state, float *action) {{
    static float obs[{obs_dim + act_in}];
    int i;
    {nl.join(assemble)}
    {c["query"]}{stage_call}
    {nl.join(push)}
}}
{base_def}"""
    return header, source


def _program_function(signature: str, e: _Emitter, last: str, n: int, out: str) -> str:
    """A C function running an emitted program on ``x`` and copying its ``n`` outputs from ``last`` to ``out``."""
    nl = "\n    "
    return (f"{signature} {{\n    int i, o, g, h;\n    (void)g; (void)h; (void)o;\n"
            f"    {nl.join(line.replace(chr(10), nl) for line in e.body)}\n"
            f"    for (i = 0; i < {n}; ++i) {out}[i] = {last}[i];\n}}\n")


def _base_action(ops: list[Op], e: _Emitter, prefix: str, act_dim: int) -> tuple[str, str]:
    """A residual over a base: the declaration and definition of ``{prefix}_base_action``, the base's last action,
    which the safety filter bounds the residual against; empty strings otherwise."""
    residual = residual_op(ops)
    if residual is None:
        return "", ""
    base_buf = e.saved[int(residual.attrs["index"])][0]
    return (f"/* the base policy's action of the last forward/step ({act_dim} floats): a residual over a "
            f"base */\nvoid {prefix}_base_action(float *out);\n",
            f"\nvoid {prefix}_base_action(float *out) {{\n    int i;\n"
            f"    for (i = 0; i < {act_dim}; ++i) out[i] = {base_buf}[i];\n}}\n")


def _chunking(prefix: str, chunk: dict | None, base: bool, horizon: int, execute: int, obs_dim: int, act_dim: int,
              out_dim: int, q_dim: int) -> dict[str, str]:
    """The C of an action-chunked policy (or base): its defines, docs, queue state and reset, and ``query``, what
    ``step`` does to get this tick's action: run the network every ``execute``-th call and read the queue, or (ACT's
    temporal ensembling) run it every call and average the kept chunks by age. A plain policy: forward, nothing
    kept."""
    if not chunk:
        return {"defs": "", "reset_doc": "", "step_doc": "", "state": "", "reset": "", "base_decl": "",
                "forward_doc": f"action ({act_dim} floats in [-1, 1])", "query": f"{prefix}_forward(obs, action);"}
    # the chunked program, and where step puts the action it queues: the action, or the base's action after the
    # observation (then the residual stage)
    fn, dst = (f"{prefix}_base_chunk", f"(obs + {obs_dim})") if base else (f"{prefix}_forward", "action")
    P = prefix.upper()
    what = "a residual over an action-chunked base: each base chunk holds" if base else \
        "an action-chunked policy: each forward predicts"
    c = {"defs": (f"/* {what} {horizon} actions, step executes {execute} of them before it looks again */\n"
                  f"#define {P}_CHUNK {horizon}\n#define {P}_EXECUTE {execute}\n"),
         "reset_doc": " and the chunk queue",
         "forward_doc": f"{horizon} actions of {act_dim} floats in [-1, 1], in order ({out_dim} floats)",
         "base_decl": "",
         "step_doc": f"; runs the network every {execute}-th call (or after a reset)",
         "query": (f"if (chunk_next >= {P}_EXECUTE) {{\n        {fn}(obs, chunk_q);\n"
                   f"        chunk_next = 0;\n    }}\n"
                   f"    for (i = 0; i < {act_dim}; ++i) {dst}[i] = chunk_q[chunk_next * {act_dim} + i];\n"
                   f"    ++chunk_next;"),
         "state": f"static float chunk_q[{q_dim}];\nstatic int chunk_next = {execute};\n",
         "reset": f"\n    chunk_next = {P}_EXECUTE;"}
    if base:
        c["forward_doc"] = (f"action ({act_dim} floats in [-1, 1]; the base's action from a chunk predicted on this "
                            "observation)")
        c["base_decl"] = (f"/* full observation -> the base's chunk ({horizon} actions of {act_dim} floats, in "
                          f"order) */\nvoid {prefix}_base_chunk(const float *obs, float *chunk);\n")
    if chunk.get("ensemble") is not None:  # temporal ensembling: every step, the kept chunks weighted by age
        w = np.exp(float(chunk["ensemble"]) * np.arange(horizon, dtype=np.float32)).astype(np.float32)
        c["step_doc"] = "; runs the network every call and averages the last chunks' predictions (ACT's ensembling)"
        c["state"] = (f"static const float CHUNK_W[{horizon}] = {_floats(w)};\n"
                      f"static float chunk_past[{horizon * q_dim}];\nstatic int chunk_valid = 0;\n")
        c["reset"] = "\n    chunk_valid = 0;"
        c["query"] = (f"{{\n        int j;\n        float wsum = 0.0f;\n"
                      f"        for (i = {horizon * q_dim - 1}; i >= {q_dim}; --i)\n"
                      f"            chunk_past[i] = chunk_past[i - {q_dim}];\n"
                      f"        {fn}(obs, chunk_past);\n"
                      f"        if (chunk_valid < {horizon}) ++chunk_valid;\n"
                      f"        for (i = 0; i < {act_dim}; ++i) {dst}[i] = 0.0f;\n"
                      f"        for (j = 0; j < chunk_valid; ++j) {{\n            wsum += CHUNK_W[j];\n"
                      f"            for (i = 0; i < {act_dim}; ++i) {dst}[i] += CHUNK_W[j] * "
                      f"chunk_past[j * {q_dim + act_dim} + i];\n        }}\n"
                      f"        for (i = 0; i < {act_dim}; ++i) {dst}[i] /= wsum;\n    }}")
    return c


def _observation(layout: Layout, act_dim: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """C lines of ``step``'s observation assembly, the kept state's declarations, what ``step`` pushes after the
    action and what ``reset`` restores: robot terms from ``state``, history terms from the kept history (the clipped
    action pushed in), average terms kept from the robot terms they average (the first value after a reset, then
    ``decay * avg + (1 - decay) * value``)."""
    assemble, hist_decl, push = [], [], []
    s_off, state_at = 0, {}
    for t in layout.robot_terms("policy"):
        state_at[t.name], s_off = s_off, s_off + t.size
    for name, sl in layout.slices("policy").items():
        term = next(t for t in layout.terms("policy") if t.name == name)
        if term.source == "robot":
            assemble.append(f"for (i = 0; i < {term.size}; ++i) obs[{sl.start} + i] = state[{state_at[name]} + i];")
        elif term.source == "average":
            d = np.float32(term.average_decay)
            hist_decl.append(f"static float avg_{name}[{term.size}];")
            assemble.append(f"for (i = 0; i < {term.size}; ++i) {{\n"
                            f"        const float v = state[{state_at[term.average_of]} + i];\n"
                            f"        avg_{name}[i] = avg_first ? v : {flit(float(d))} * avg_{name}[i] + "
                            f"{flit(float(np.float32(1.0) - d))} * v;\n"
                            f"        obs[{sl.start} + i] = avg_{name}[i];\n    }}")
        else:
            hist_decl.append(f"static float hist_{name}[{term.size}];")
            assemble.append(f"for (i = 0; i < {term.size}; ++i) obs[{sl.start} + i] = hist_{name}[i];")
            push.append(f"for (i = 0; i < {term.size - act_dim}; ++i) hist_{name}[i] = hist_{name}[i + {act_dim}];\n"
                        f"    for (i = 0; i < {act_dim}; ++i) hist_{name}[{term.size - act_dim} + i] = "
                        f"action[i] < -1.0f ? -1.0f : (action[i] > 1.0f ? 1.0f : action[i]);")
    resets = [f"for (i = 0; i < {t.size}; ++i) hist_{t.name}[i] = {flit(float(t.history_init))};"
              for t in layout.terms("policy") if t.source == "history"]
    if any(t.source == "average" for t in layout.terms("policy")):
        hist_decl.append("static int avg_first = 1;")
        resets.append("avg_first = 1;")
        push.append("avg_first = 0;")
    return assemble, hist_decl, push, resets


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise UserError("no C compiler found (install gcc, or set CC)")
    return cc


def compile_shared(source: Path | list[Path], out: Path, extra: list[str] | None = None) -> Path:
    """Build ``source`` (one file or several) into a shared library for ctypes (with the strict flags)."""
    sources = [str(s) for s in (source if isinstance(source, list) else [source])]
    cmd = [compiler(), *CFLAGS, "-fPIC", "-shared", *(extra or []), *sources, "-o", str(out), "-lm"]
    _run(cmd)
    return out


def compile_object(source: Path, out: Path, extra: list[str] | None = None) -> Path:
    _run([compiler(), *CFLAGS, "-c", *(extra or []), str(source), "-o", str(out)])
    return out


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise UserError(f"C build failed ({' '.join(cmd)}): {(r.stderr or r.stdout).strip().splitlines()[0]}")


def size_report(obj: Path) -> dict[str, int]:
    """Berkeley ``size`` of an object: text (code + const data: what goes in flash), data, bss (RAM)."""
    tool = shutil.which("size")
    if tool is None:
        return {}
    r = subprocess.run([tool, str(obj)], capture_output=True, text=True, check=True)
    text, data, bss = (int(v) for v in r.stdout.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss, "flash": text + data, "ram": data + bss}


def build_key() -> str:
    """What a compiled artifact depends on besides its sources: the machine and the compiler."""
    import platform

    return f"{platform.system()}-{platform.machine()}-{compiler()}"


def source_hash(*texts: str) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
    return h.hexdigest()
