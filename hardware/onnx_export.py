"""A folded policy program (``embodied.policies.export``) written as an ONNX graph of standard ops
(Gemm, Relu, Tanh, Elu, Clip, Sub, Div, Slice; Identity, Concat, Mul, Add, Max, Min for a residual over a base), input
``obs [batch, obs_dim]`` (``input_name``: a residual's second program reads ``obs_base``, the observation then the
base's action), output ``action`` (and ``base_action``, the base's action, for a residual over a base). Built
with ``onnx.helper`` directly: the graph is exactly the program, with nothing a tracer adds."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from embodied.policies.export import Op, residual_op

OPSET = 17


def program_to_onnx(ops: list[Op], obs_dim: int, doc: str = "", input_name: str = "obs") -> onnx.ModelProto:
    nodes, inits = [], []
    x = input_name

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    dim = obs_dim
    saved: list[str] = []  # tensors kept by save ops (a composite policy)
    for i, op in enumerate(ops):
        if op.kind.startswith("group_"):
            raise ValueError("fold() the program before writing ONNX")
        y = "action" if i == len(ops) - 1 else f"h{i}"
        a = op.arrays
        if op.kind == "dense":
            nodes.append(helper.make_node("Gemm", [x, const(f"W{i}", a["W"]), const(f"b{i}", a["b"])], [y],
                                          transB=1))
        elif op.kind == "normalize":
            c = float(op.attrs["clip"])
            nodes += [helper.make_node("Sub", [x, const(f"mean{i}", a["mean"])], [f"c{i}"]),
                      helper.make_node("Div", [f"c{i}", const(f"std{i}", a["std"])], [f"d{i}"]),
                      helper.make_node("Clip", [f"d{i}", const(f"lo{i}", np.float32(-c)),
                                                const(f"hi{i}", np.float32(c))], [y])]
        elif op.kind in ("relu", "tanh", "elu"):
            kind = {"relu": "Relu", "tanh": "Tanh", "elu": "Elu"}[op.kind]
            nodes.append(helper.make_node(kind, [x], [y], **({"alpha": 1.0} if kind == "Elu" else {})))
        elif op.kind == "clip":
            nodes.append(helper.make_node("Clip", [x, const(f"lo{i}", np.float32(op.attrs["lo"])),
                                                   const(f"hi{i}", np.float32(op.attrs["hi"]))], [y]))
        elif op.kind == "image_features":
            _image_features(nodes, const, op, i, x, dim, y)
        elif op.kind == "slice":
            nodes.append(helper.make_node("Slice", [x, const(f"s{i}", np.array([op.attrs["start"]], np.int64)),
                                                    const(f"e{i}", np.array([op.attrs["stop"]], np.int64)),
                                                    const(f"a{i}", np.array([1], np.int64))], [y]))
        elif op.kind == "save":
            saved.append(x)
            nodes.append(helper.make_node("Identity", [x], [y]))
        elif op.kind == "concat_saved":
            nodes.append(helper.make_node("Concat", [saved[int(op.attrs["index"])], x], [y], axis=1))
        elif op.kind == "load_saved":
            nodes.append(helper.make_node("Identity", [saved[int(op.attrs["index"])]], [y]))
        elif op.kind == "add_saved":
            nodes.append(helper.make_node("Add", [saved[int(op.attrs["index"])], x], [y]))
        elif op.kind == "residual_add":
            _residual_add(nodes, const, op, i, x, saved[int(op.attrs["index"])], y)
        else:
            raise ValueError(f"no ONNX op for {op.kind!r}")
        x, dim = y, op.out_dim(dim)
    outputs = [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", dim])]
    residual = residual_op(ops)
    if residual is not None:  # the base's action as a second output: the safety filter bounds the residual with it
        nodes.append(helper.make_node("Identity", [saved[int(residual.attrs["index"])]], ["base_action"]))
        outputs.append(helper.make_tensor_value_info("base_action", TensorProto.FLOAT, ["batch", dim]))
    graph = helper.make_graph(
        nodes, "policy", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", obs_dim])], outputs,
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="embodied",
                              doc_string=doc)
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def _slice(nodes: list, const, src: str, name: str, start: int, stop: int) -> str:
    """``name = src[:, start:stop]`` as a Slice node."""
    nodes.append(helper.make_node("Slice", [src, const(f"{name}s", np.array([start], np.int64)),
                                            const(f"{name}e", np.array([stop], np.int64)),
                                            const(f"{name}a", np.array([1], np.int64))], [name]))
    return name


def program_from_onnx(model: onnx.ModelProto) -> tuple[list[Op], int]:
    """The program an ONNX graph of ``program_to_onnx``'s plain ops computes (Gemm, Relu, Tanh, Elu, Clip, the
    Sub-Div-Clip of a normalizer, Slice), and its input size: how a bundle's policy becomes a torch module again
    (a frozen base under a residual). Another graph is a ``UserError`` naming the op it cannot read."""
    from embodied.core.errors import UserError

    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    scalar = lambda name: float(np.asarray(consts[name]).reshape(-1)[0])  # noqa: E731
    nodes, ops, i = list(g.node), [], 0
    obs_dim = g.input[0].type.tensor_type.shape.dim[1].dim_value
    while i < len(nodes):
        n = nodes[i]
        if n.op_type == "Gemm":
            trans = next((a.i for a in n.attribute if a.name == "transB"), 0)
            w = consts[n.input[1]]
            ops.append(Op("dense", {"W": np.array(w if trans else w.T, np.float32),  # copies: writable arrays
                                    "b": np.array(consts[n.input[2]], np.float32)}))
        elif n.op_type in ("Relu", "Tanh", "Elu"):
            ops.append(Op(n.op_type.lower()))
        elif n.op_type == "Sub" and i + 2 < len(nodes) and [m.op_type for m in nodes[i + 1:i + 3]] == ["Div", "Clip"]:
            clip = nodes[i + 2]
            ops.append(Op("normalize", {"mean": np.array(consts[n.input[1]], np.float32),
                                        "std": np.array(consts[nodes[i + 1].input[1]], np.float32)},
                          {"clip": scalar(clip.input[2])}))
            i += 2
        elif n.op_type == "Clip":
            ops.append(Op("clip", attrs={"lo": scalar(n.input[1]), "hi": scalar(n.input[2])}))
        elif n.op_type == "Slice":
            ops.append(Op("slice", attrs={"start": int(scalar(n.input[1])), "stop": int(scalar(n.input[2]))}))
        else:
            raise UserError(f"the policy's ONNX graph has a {n.op_type} node, which a residual's base cannot hold "
                            "(bundles of MLP policies from embodied export can be)")
        i += 1
    return ops, int(obs_dim)


def _image_features(nodes: list, const, op: Op, i: int, x: str, dim: int, y: str) -> None:
    """Appends to ``nodes``: ``y`` = the CNN's features of the image slice ``[start, stop)`` of ``x`` (``[B, dim]``),
    then the entries before and after the image."""
    t, a = op.attrs, op.arrays
    s0, s1 = int(t["start"]), int(t["stop"])
    img = _slice(nodes, const, x, f"img{i}", s0, s1)
    shape = const(f"shape{i}", np.array([-1, int(t["C"]), int(t["H"]), int(t["W"])], np.int64))
    nodes.append(helper.make_node("Reshape", [img, shape], [f"im{i}"]))
    h = f"im{i}"
    for j in range(int(t["convs"])):
        s = int(t[f"s{j}"])
        w_b = [const(f"cw{i}_{j}", a[f"W{j}"]), const(f"cb{i}_{j}", a[f"b{j}"])]
        nodes += [helper.make_node("Conv", [h, *w_b], [f"cv{i}_{j}"], strides=[s, s]),
                  helper.make_node("Relu", [f"cv{i}_{j}"], [f"cr{i}_{j}"])]
        h = f"cr{i}_{j}"
    nodes += [helper.make_node("Flatten", [h], [f"fl{i}"], axis=1),
              helper.make_node("Gemm", [f"fl{i}", const(f"fw{i}", a["fcW"]), const(f"fb{i}", a["fcb"])],
                               [f"fc{i}"], transB=1),
              helper.make_node("Relu", [f"fc{i}"], [f"ff{i}"])]
    parts = [f"ff{i}"]
    if s0 > 0:
        parts.append(_slice(nodes, const, x, f"pre{i}", 0, s0))
    if s1 < dim:
        parts.append(_slice(nodes, const, x, f"post{i}", s1, dim))
    nodes.append(helper.make_node("Concat", parts, [y], axis=1))


def _residual_add(nodes: list, const, op: Op, i: int, x: str, base: str, y: str) -> None:
    """Appends to ``nodes``: ``y = clip(base + clip(scale * x, -limit, limit), -1, 1)``."""
    lim = np.asarray(op.attrs["limit"], np.float32)
    nodes.append(helper.make_node("Mul", [x, const(f"scale{i}", np.asarray(op.attrs["scale"], np.float32))],
                                  [f"m{i}"]))
    if lim.ndim:  # one bound per entry: Clip takes scalar bounds only
        nodes += [helper.make_node("Max", [f"m{i}", const(f"rlo{i}", -lim)], [f"q{i}"]),
                  helper.make_node("Min", [f"q{i}", const(f"rhi{i}", lim)], [f"r{i}"])]
    else:
        nodes.append(helper.make_node("Clip", [f"m{i}", const(f"rlo{i}", -lim), const(f"rhi{i}", lim)], [f"r{i}"]))
    nodes.append(helper.make_node("Add", [base, f"r{i}"], [f"s{i}"]))
    nodes.append(helper.make_node("Clip", [f"s{i}", const(f"lo{i}", np.float32(-1.0)),
                                           const(f"hi{i}", np.float32(1.0))], [y]))
