"""A folded policy program (``embodied.policies.export``) written as an ONNX graph of standard ops
(Gemm, Relu, Tanh, Elu, Clip, Sub, Div, Slice), input ``obs [batch, obs_dim]``, output ``action``.
Built with ``onnx.helper`` directly: the graph is exactly the program, with nothing a tracer adds."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from embodied.policies.export import Op

OPSET = 17


def program_to_onnx(ops: list[Op], obs_dim: int, doc: str = "") -> onnx.ModelProto:
    nodes, inits = [], []
    x = "obs"

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    dim = obs_dim
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
        elif op.kind == "slice":
            nodes.append(helper.make_node("Slice", [x, const(f"s{i}", np.array([op.attrs["start"]], np.int64)),
                                                    const(f"e{i}", np.array([op.attrs["stop"]], np.int64)),
                                                    const(f"a{i}", np.array([1], np.int64))], [y]))
        else:
            raise ValueError(f"no ONNX op for {op.kind!r}")
        x, dim = y, op.out_dim(dim)
    graph = helper.make_graph(
        nodes, "policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="embodied",
                              doc_string=doc)
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model
