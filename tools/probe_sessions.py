"""Measure what single-op probes cannot: how a whole session on an EP treats control flow (If and
Loop, with and without outer-scope reads, an LSTM inside an If branch), dynamic shapes on a QDQ
model, and int64 elementwise work. Each case is a small model built here with onnx.helper; its
session is built as `check --prove` builds it (an ortprep worker, CPU fallback allowed, the
default optimization level, the EP's options: QNN for ortprep's default device, OpenVINO's CPU
device under its own environment), and the outcome recorded: created or not, the EP's words, how
many nodes the EP took.

    .venv/bin/python tools/probe_sessions.py [--runtime openvino-cpu=.venv-openvino/bin/python]

Writes ortprep/eps/data/measured/sessions.json, the source of the session rules in
ortprep/eps/session_rules.py (each rule names the cases it stands on). Rerun it whenever an EP
package updates; tests/test_session_rules.py holds the rules to the real sessions again.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "ortprep" / "eps" / "data" / "measured" / "sessions.json"
C, H = 8, 16  # channels, height and width of the image-like cases


def _init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "case", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    return model


def _image(name: str = "x", batch: int | str = 1):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, C, H, H])


def _weights(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((C, C, 3, 3)).astype(np.float32) * 0.1


def if_simple() -> onnx.ModelProto:
    """Conv, then an If on the input's mean (Relu or Sigmoid*x), reading the Conv's output from the
    outer scope, then a Conv."""
    then_g = helper.make_graph([helper.make_node("Relu", ["c"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, C, H, H])])
    else_g = helper.make_graph(
        [helper.make_node("Sigmoid", ["c"], ["g"]), helper.make_node("Mul", ["c", "g"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, C, H, H])],
    )
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0, name="mean"),
             helper.make_node("Greater", ["m", "zero"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["b"], then_branch=then_g, else_branch=else_g, name="branch"),
             helper.make_node("Conv", ["b", "w"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                  [_init("w", _weights()), _init("zero", np.float32(0))])


def _loop_body(with_conv: bool) -> onnx.GraphProto:
    nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    if with_conv:
        nodes += [helper.make_node("Conv", ["s_in", "w"], ["cv"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["cv"], ["r"]), helper.make_node("Add", ["s_in", "r"], ["s_out"])]
    else:
        nodes += [helper.make_node("Add", ["s_in", "one"], ["s_out"])]
    return helper.make_graph(nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [1, C, H, H])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, C, H, H])])


def loop(with_conv: bool) -> onnx.ModelProto:
    """Conv, then a Loop of 3 trips over a residual block (Conv/Relu/Add reading its weight from the
    outer scope) or over an Add of a constant, then a Conv."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Loop", ["trips", "go", "c"], ["l"], body=_loop_body(with_conv), name="loop"),
             helper.make_node("Conv", ["l", "w"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                  [_init("w", _weights()), _init("trips", np.int64(3)), _init("go", np.bool_(True)),
                   _init("one", np.float32(1))])


def _lstm(prefix: str, seq: int, features: int, hidden: int, source: str, rng) -> tuple[list, list]:
    inits = [_init(f"{prefix}W", rng.standard_normal((1, 4 * hidden, features)).astype(np.float32) * 0.2),
             _init(f"{prefix}R", rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.2)]
    nodes = [helper.make_node("LSTM", [source, f"{prefix}W", f"{prefix}R"], [f"{prefix}Y"], hidden_size=hidden,
                              name=f"{prefix}lstm")]
    return nodes, inits


def lstm_plain() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes, inits = _lstm("", 12, 16, 16, "x", rng)
    nodes.append(helper.make_node("Squeeze", ["Y", "axes"], ["y"], name="squeeze"))
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [12, 1, 16])],
        inits + [_init("axes", np.array([1], np.int64))],
    )


def lstm_in_if() -> onnx.ModelProto:
    """An If on the input's mean whose two branches each run an LSTM (as silero-vad's model does
    for its two sample rates), each reading the graph input from the outer scope."""
    rng = np.random.default_rng(2)
    branches = []
    for name in ("then", "else"):
        nodes, inits = _lstm(f"{name}_", 12, 16, 16, "x", rng)
        nodes.append(helper.make_node("Squeeze", [f"{name}_Y", "axes"], [f"{name}_y"]))
        branches.append(
            helper.make_graph(
                nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [12, 1, 16])], inits
            )
        )
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0, name="mean"),
             helper.make_node("Greater", ["m", "zero"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["b"], then_branch=branches[0], else_branch=branches[1], name="branch"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 1, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [12, 1, 16])],
                  [_init("zero", np.float32(0)), _init("axes", np.array([1], np.int64))])


def qdq_convs(batch: int | str) -> onnx.ModelProto:
    """Two Conv/Relu in QDQ form (uint8 activations, uint8 weights), batch static or named."""
    rng = np.random.default_rng(3)
    inits = [
        _init("s", np.float32(0.05)),
        _init("z", np.uint8(128)),
        _init("ws", np.float32(0.01)),
        _init("wz", np.uint8(128)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
    ]
    current = "xd"
    for k in range(2):
        inits.append(_init(f"w{k}", rng.integers(100, 156, size=(C, C, 3, 3)).astype(np.uint8)))
        nodes += [helper.make_node("DequantizeLinear", [f"w{k}", "ws", "wz"], [f"wd{k}"]),
                  helper.make_node("Conv", [current, f"wd{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}"),
                  helper.make_node("QuantizeLinear", [f"r{k}", "s", "z"], [f"q{k}"]),
                  helper.make_node("DequantizeLinear", [f"q{k}", "s", "z"], [f"d{k}"])]
        current = f"d{k}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    return _model(
        nodes, [_image(batch=batch)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, C, H, H])], inits
    )


def int64_elementwise() -> onnx.ModelProto:
    """int64 Add and Mul on a graph input, then a Cast to float and a Relu."""
    nodes = [
        helper.make_node("Add", ["x", "k"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "k"], ["m"], name="mul"),
        helper.make_node("Cast", ["m"], ["f"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Relu", ["f"], ["y"], name="relu"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [_init("k", np.array([3], np.int64))],
    )


def loop_then_relu() -> onnx.ModelProto:
    """Conv, then a Loop of 3 trips over an Add of a constant, then a Relu (no Conv after the Loop)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Loop", ["trips", "go", "c"], ["l"], body=_loop_body(False), name="loop"),
             helper.make_node("Relu", ["l"], ["y"], name="relu")]
    return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                  [_init("w", _weights()), _init("trips", np.int64(3)), _init("go", np.bool_(True)),
                   _init("one", np.float32(1))])


def if_reads_graph_input() -> onnx.ModelProto:
    """An If on the input's mean whose branches (Relu, or Sigmoid*x) read the graph input itself
    from the outer scope, then a Conv."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, C, H, H])])
    else_g = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["g"]), helper.make_node("Mul", ["x", "g"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, C, H, H])],
    )
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0, name="mean"),
             helper.make_node("Greater", ["m", "zero"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["b"], then_branch=then_g, else_branch=else_g, name="branch"),
             helper.make_node("Conv", ["b", "w"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                  [_init("w", _weights()), _init("zero", np.float32(0))])


def reducemean_to_scalar() -> onnx.ModelProto:
    """A Conv, a ReduceMean over every axis with keepdims=0 (a scalar), a Mul of the Conv's output
    by it; and a ReduceMean over the channels with keepdims=1 beside it, added in."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("ReduceMean", ["c"], ["m"], keepdims=0, name="mean_scalar"),
             helper.make_node("Mul", ["c", "m"], ["s"], name="scale"),
             helper.make_node("ReduceMean", ["c"], ["k"], axes=[1], keepdims=1, name="mean_channels"),
             helper.make_node("Add", ["s", "k"], ["y"], name="add")]
    return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                  [_init("w", _weights())])


def _qdq(source: str, out: str, scale: str = "s", zero: str = "z", name: str = "") -> list:
    """A QuantizeLinear/DequantizeLinear pair on ``source`` (uint8 activations), as ORT's QDQ format writes it."""
    return [helper.make_node("QuantizeLinear", [source, scale, zero], [f"{out}_q"], name=f"{name or out}_q"),
            helper.make_node("DequantizeLinear", [f"{out}_q", scale, zero], [out], name=f"{name or out}_dq")]


def _qdq_inits(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [_init("s", np.float32(0.05)), _init("z", np.uint8(128)), _init("ws", np.float32(0.01)),
            _init("wz", np.uint8(128)), _init("wq", rng.integers(100, 156, size=(C, C, 3, 3)).astype(np.uint8))]


def qdq_control_flow(kind: str) -> onnx.ModelProto:
    """A QDQ model (uint8 activations and weights) with control flow between two quantized Convs:
    ``if`` an If on the input's mean (Relu, or Sigmoid*x, reading the Conv's dequantized output from
    the outer scope), ``loop`` a Loop of 3 trips over an Add of a constant, ``if_loop`` both in turn,
    ``loop_if`` the Loop first (the If's branches then read the Loop's dequantized output),
    ``loop_first`` the Loop on the input itself, then the If and one Conv, ``loop_only`` the Loop
    alone between the input's and the output's Q/DQ pairs; Q/DQ pairs around each, as
    a quantizer leaves a float If or Loop."""
    nodes = _qdq("x", "xd") + [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="w_dq")]
    if kind == "loop_only":
        nodes = _qdq("x", "xd") + [helper.make_node("Loop", ["trips", "go", "xd"], ["l"], body=_loop_body(False),
                                                    name="loop")] + _qdq("l", "y")
        return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                      _qdq_inits(4)[:2] + [_init("trips", np.int64(3)), _init("go", np.bool_(True)),
                                           _init("one", np.float32(1))])
    if kind == "loop_first":
        current = "xd"
        kind = "loop_if"
    else:
        nodes += [helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1], name="conv0")]
        nodes += _qdq("c", "cd")
        current = "cd"
    inits = _qdq_inits(4) + [_init("zero", np.float32(0)), _init("trips", np.int64(3)), _init("go", np.bool_(True)),
                             _init("one", np.float32(1))]
    if kind == "loop_if":
        nodes += [helper.make_node("Loop", ["trips", "go", current], ["l"], body=_loop_body(False), name="loop")]
        nodes += _qdq("l", "ld")
        current = "ld"
    if kind in ("if", "if_loop", "loop_if"):
        then_g = helper.make_graph([helper.make_node("Relu", [current], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, C, H, H])])
        else_g = helper.make_graph(
            [helper.make_node("Sigmoid", [current], ["g"]), helper.make_node("Mul", [current, "g"], ["e"])], "else",
            [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, C, H, H])])
        nodes += [helper.make_node("ReduceMean", ["xd"], ["m"], keepdims=0, name="mean"),
                  helper.make_node("Greater", ["m", "zero"], ["cond"], name="greater"),
                  helper.make_node("If", ["cond"], ["b"], then_branch=then_g, else_branch=else_g, name="branch")]
        nodes += _qdq("b", "bd")
        current = "bd"
    if kind in ("loop", "if_loop"):
        body = _loop_body(False)
        nodes += [helper.make_node("Loop", ["trips", "go", current], ["l"], body=body, name="loop")]
        nodes += _qdq("l", "ld")
        current = "ld"
    nodes += [helper.make_node("Conv", [current, "wd"], ["c1"], pads=[1, 1, 1, 1], name="conv1")]
    nodes += _qdq("c1", "y")
    return _model(nodes, [_image()], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])], inits)


CASES = {
    "loop_then_relu": loop_then_relu,
    "if_reads_graph_input": if_reads_graph_input,
    "reducemean_to_scalar": reducemean_to_scalar,
    "if_simple": if_simple,
    "loop_conv_body": lambda: loop(True),
    "loop_add_body": lambda: loop(False),
    "lstm_plain": lstm_plain,
    "lstm_in_if": lstm_in_if,
    "qdq_static_batch": lambda: qdq_convs(1),
    "qdq_dynamic_batch": lambda: qdq_convs("batch"),
    "int64_elementwise": int64_elementwise,
    "qdq_if": lambda: qdq_control_flow("if"),
    "qdq_loop": lambda: qdq_control_flow("loop"),
    "qdq_if_loop": lambda: qdq_control_flow("if_loop"),
    "qdq_loop_if": lambda: qdq_control_flow("loop_if"),
    "qdq_loop_first": lambda: qdq_control_flow("loop_first"),
    "qdq_loop_only": lambda: qdq_control_flow("loop_only"),
}


def measure(runtimes: dict[str, str]) -> dict:
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.requests import Prove
    from ortprep.runtime.targets import ep_runtime, session_options
    from ortprep.runtime.worker import call, workers_scope

    targets = {}
    for label in ("qnn", "openvino-cpu"):
        spec = resolve_ep(label)
        target = ep_runtime(spec, {label: Path(runtimes[label])} if label in runtimes else {})
        if target.available:
            targets[label] = (spec, target, session_options(target))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="ortprep-sessions-") as tmp, workers_scope():
        for name, build in CASES.items():
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(build(), path)
            rows[name] = {}
            for label, (spec, target, options) in targets.items():
                reply = call(Prove(model=path, provider=spec.provider, provider_options=options, plugin=target.plugin),
                             python=target.python, timeout=300)
                assignment = reply.placement.get("default", {}).get("assignment", {}) if reply.ok else {}
                rows[name][label] = {"status": "created" if reply.ok else reply.status,
                                     "nodes_total": len(assignment),
                                     "nodes_on_ep": sum(1 for ep in assignment.values() if ep == spec.provider),
                                     "on_ep": sorted(n for n, ep in assignment.items() if ep == spec.provider),
                                     "message": "" if reply.ok else reply.message[-400:],
                                     "provider_options": options}
                print(
                    f"{name:20s} {label:13s} {rows[name][label]['status']:8s} "
                    f"{rows[name][label]['nodes_on_ep']}/{rows[name][label]['nodes_total']} "
                    f"{rows[name][label]['message'][-120:]}"
                )
    versions = {}
    for package in ("onnxruntime", "onnxruntime-qnn", "onnx"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    if "openvino-cpu" in targets:
        versions["onnxruntime-openvino"] = targets["openvino-cpu"][1].probe.version or "?"
    return {"generated_by": "tools/probe_sessions.py", "date": datetime.date.today().isoformat(), "versions": versions,
            "cases": {name: (CASES[name].__doc__ or "").strip() or name for name in CASES}, "sessions": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", action="append", default=[], metavar="EP=PYTHON")
    args = parser.parse_args()
    runtimes = dict(item.split("=", 1) for item in args.runtime)
    result = measure(runtimes)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
