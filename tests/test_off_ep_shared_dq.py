"""Keeping a region off the EP where a DequantizeLinear between its nodes is shared by two of
them (openWakeWord's mel front end: one DQ feeds the STFT's real and imaginary Convs), and where the
region starts at a graph input. The shared DQ belongs to neither Conv's unit; left in the main graph
it split the region into two If nodes with the EP's node between them. The QuantizeLinear of the
graph input, left outside, QNN refuses. Either way QNN's capability became invalid and ORT ran
every node on the CPU EP (`load`: LOD011). Both now move with the region: one If, and QNN takes
the rest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import invoke
from ep_marks import needs_qnn

CHANNELS, SIZE = 4, 8


def shared_dq_model(path: Path) -> Path:
    """uint8 QDQ: input -> Relu 'front' -> one Q/DQ read by Convs 'conv_a' and 'conv_b' -> Add
    'join' -> Conv 'back' -> output; each activation through its own Q/DQ pair."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
             numpy_helper.from_array(np.array(128, np.uint8), "wz")]
    nodes = []

    def qdq(source: str, name: str) -> str:
        nodes.extend([helper.make_node("QuantizeLinear", [source, "s", "z"], [f"{name}_q"], name=f"{name}_Q"),
                      helper.make_node("DequantizeLinear", [f"{name}_q", "s", "z"], [name], name=f"{name}_DQ")])
        return name

    def conv(source: str, name: str) -> str:
        weights = rng.integers(100, 156, size=(CHANNELS, CHANNELS, 1, 1)).astype(np.uint8)
        inits.append(numpy_helper.from_array(weights, f"{name}_w_q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_w_q", "ws", "wz"], [f"{name}_w"],
                                      name=f"{name}_w_DQ"))
        nodes.append(helper.make_node("Conv", [source, f"{name}_w"], [f"{name}_out"], name=name))
        return qdq(f"{name}_out", f"{name}_act")

    x = qdq("input", "input_act")
    nodes.append(helper.make_node("Relu", [x], ["front_out"], name="front"))
    shared = qdq("front_out", "front_act")  # one DQ, read by both Convs
    a, b = conv(shared, "conv_a"), conv(shared, "conv_b")
    nodes.append(helper.make_node("Add", [a, b], ["join_out"], name="join"))
    back = conv(qdq("join_out", "join_act"), "back")
    nodes.append(helper.make_node("Identity", [back], ["output"], name="out"))
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, "shared_dq", [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _ifs(path: Path) -> list[str]:
    return [node.name for node in onnx.load(str(path)).graph.node if node.op_type == "If"]


def test_a_dq_shared_inside_the_region_moves_with_it_into_one_if(tmp_path):
    model = shared_dq_model(tmp_path / "m.onnx")
    out = tmp_path / "off.onnx"
    done = invoke("convert", model, "--keep-off-ep", "front", "--keep-off-ep", "conv_a", "--keep-off-ep", "conv_b",
                  "-o", out, "--json")
    assert done.exit_code == 0, done.stdout[-800:]
    assert done.json()["verify"]["max_abs_diff"] == 0.0
    assert len(_ifs(out)) == 1  # three before: the shared DQ stood between front's If and the Convs'
    main = {node.name for node in onnx.load(str(out)).graph.node}
    assert "front_act_DQ" not in main and "input_act_Q" not in main  # both inside the If
    assert {"join", "back", "join_act_Q", "back_w_DQ"} <= main  # the rest stays for the EP


@needs_qnn
def test_qnn_takes_the_rest_of_a_region_kept_off_around_a_shared_dq(tmp_path):
    model = shared_dq_model(tmp_path / "m.onnx")
    out = tmp_path / "off.onnx"
    done = invoke("convert", model, "--keep-off-ep", "front", "--keep-off-ep", "conv_a", "--keep-off-ep", "conv_b",
                  "-o", out)
    assert done.exit_code == 0, done.stderr[-800:]
    sample = tmp_path / "x.npz"
    np.savez(sample, input=np.random.default_rng(0).standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32))
    loaded = invoke("load", out, "--ep", "qnn", "--inputs", sample, "--json")
    codes = {f["code"] for f in loaded.json()["findings"]}
    assert "LOD011" not in codes, loaded.stdout[-1500:]  # before: QNN ran none of the model
    assert loaded.exit_code == 0, loaded.stdout[-1500:]


def _reader_model(from_input: bool) -> onnx.ModelProto:
    """A DQ 'f_DQ' read by Conv 'conv2' and by Mul 'mul1', and mul1 also reads, through a Relu left
    on the EP, what conv2 makes. ``from_input``: f_DQ's Q reads the graph input; else a Relu
    'front' comes first."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.full((CHANNELS, CHANNELS, 1, 1), 130, np.uint8), "w_q")]
    nodes = []

    def qdq(source: str, name: str) -> str:
        nodes.extend([helper.make_node("QuantizeLinear", [source, "s", "z"], [f"{name}_q"], name=f"{name}_Q"),
                      helper.make_node("DequantizeLinear", [f"{name}_q", "s", "z"], [name], name=f"{name}_DQ")])
        return name

    if from_input:
        shared = qdq("x", "f")
    else:
        nodes.append(helper.make_node("Relu", [qdq("x", "xa")], ["front_out"], name="front"))
        shared = qdq("front_out", "f")
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["w"], name="w_DQ"),
              helper.make_node("Conv", [shared, "w"], ["c2"], name="conv2")]
    nodes.append(helper.make_node("Relu", [qdq("c2", "c2a")], ["r"], name="relu"))
    nodes.append(helper.make_node("Mul", [shared, qdq("r", "ra")], ["m"], name="mul1"))
    nodes.append(helper.make_node("Identity", [qdq("m", "ma")], ["y"], name="out"))
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, "readers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_an_absorbed_dq_never_makes_an_if_wait_on_its_own_output():
    """f_DQ joins the group of the node it reads (front's), never mul1's: in mul1's If it would
    feed conv2's, which feeds mul1's through the Relu left on the EP (a cycle ORT refuses; the first
    version of the absorption did that for one order of the names). A graph input's Q and the
    shared DQ after it move together, into the reader group no other reaches (conv2's)."""
    import onnxruntime

    from ortprep.model import ModelHandle
    from ortprep.transforms.off_ep import keep_off_ep

    for names in (["front", "conv2", "mul1"], ["mul1", "front", "conv2"]):
        proto, _ = keep_off_ep(ModelHandle(proto=_reader_model(False)), names)
        onnx.checker.check_model(proto, full_check=True)
        onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        main = {node.name for node in proto.graph.node}
        assert "relu" in main and not {"f_DQ", "xa_Q"} & main, names
    proto, _ = keep_off_ep(ModelHandle(proto=_reader_model(True)), ["mul1", "conv2"])
    onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    main = {node.name for node in proto.graph.node}
    assert not {"f_Q", "f_DQ"} & main  # before: both stayed out, each waiting on the other
    conv_if = next(node for node in proto.graph.node if node.name == "ortprep_off_ep_conv2")
    inside = {inner.name for attribute in conv_if.attribute if attribute.name == "then_branch"
              for inner in attribute.g.node}
    assert {"f_Q", "f_DQ", "conv2"} <= inside
