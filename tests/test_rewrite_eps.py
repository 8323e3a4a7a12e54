"""The decompositions proven on real EPs that run here: QNN's HTP simulator (onnxruntime-qnn) and
OpenVINO's CPU device (.venv-openvino; there the ones it does not take as they are, and two more).
Each rewritten model runs wholly on the EP; where the EP does
not take the op as it is (measured: Celu, Softsign, a LayerNormalization and an RMSNormalization over two axes on QNN;
Celu, that LayerNormalization and Einsum on OpenVINO), the original leaves it to the CPU. Without
the EP these tests skip with the reason."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from cli_helpers import invoke
from ep_marks import OPENVINO_PYTHON, needs_qnn, needs_openvino, on_x86
from rewrite_cases import CASES, every_op, ir_for, single

from ortprep.eps.registry import resolve_ep
from ortprep.transforms.decompose import registry
from ortprep.transforms.decompose.apply import apply_everywhere
from ortprep.transforms.decompose.base import Decomposition
from ortprep.transforms.decompose.placement import real_placement

pytestmark = on_x86

BY_NAME = {d.name: d for d in registry.REGISTRY}
# Proven by a test of its own (QNN takes a Clip with constant bounds, so the grouped proof shows
# nothing for it); kept out of the groups below, whose composition on the simulator is fragile.
ALONE = {"clip-max-min"}
STANDARD = sorted(name for name, case in CASES.items() if not case.domain and name not in ALONE)
NOT_TAKEN = {"qnn": {"celu-exp", "softsign-div", "layernorm-reduce", "rmsnorm-reduce"},
             "openvino-cpu": {"celu-exp", "layernorm-reduce", "einsum-matmul"}}
RUNTIMES = {"qnn": None, "openvino-cpu": {"openvino-cpu": str(OPENVINO_PYTHON)}}


def prove_all(ep: str, names: list[str], opset: int, tmp_path) -> None:
    """One model with a branch per decomposition, placed before and after every branch is rewritten:
    after, no node of any rewrite is left to the CPU (one partition); before, exactly the ops the EP
    does not take as they are."""
    model = every_op(names, opset)
    original = tmp_path / "original.onnx"
    onnx.save(model, original)
    for name in names:
        assert apply_everywhere(model, BY_NAME[name], only={name}) == [name]
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(model, rewritten)
    spec = resolve_ep(ep)
    before = real_placement(original, spec, RUNTIMES[ep])
    after = real_placement(rewritten, spec, RUNTIMES[ep])
    assert before["status"] == after["status"] == "created", (before, after)
    assert before["cpu_nodes"] == sorted(NOT_TAKEN[ep] & set(names))
    assert after["cpu_nodes"] == [] and after["nodes_on_ep"] == after["nodes"] and after["partitions"] == 1


# Four branches a model: the HTP simulator composed every group of four, and failed ("Failed to
# compose Qnn graph") with eight branches whose halves it composed (onnxruntime-qnn, measured here).
GROUPS = [STANDARD[i:i + 4] for i in range(0, len(STANDARD), 4)]


@needs_qnn
@pytest.mark.parametrize("names", GROUPS, ids=["+".join(group) for group in GROUPS])
def test_every_rewrite_runs_wholly_on_qnn(names, tmp_path):
    prove_all("qnn", names, max(17, *(CASES[name].opset for name in names)), tmp_path)


@needs_openvino
@pytest.mark.parametrize("name", sorted(NOT_TAKEN["openvino-cpu"] | {"hardswish-hardsigmoid", "gelu-erf"}))
def test_the_rewrites_run_wholly_on_openvino(name, tmp_path):
    """One op a model (OpenVINO placed a model of many branches otherwise than each alone)."""
    prove_all("openvino-cpu", [name], max(17, CASES[name].opset), tmp_path)


def between(op: str, path, opset: int = 17, **attrs):
    """Neg -> op -> Sigmoid: the op between two nodes every EP takes, so its fallback splits the graph."""
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="first"),
             helper.make_node(op, ["a"], ["b"], name="middle", **attrs),
             helper.make_node("Sigmoid", ["b"], ["y"], name="last")]
    graph = helper.make_graph(nodes, "around", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_for(opset))
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


@needs_qnn
def test_convert_proves_the_rewrite_on_qnn(tmp_path):
    """QNN's table has no Celu, and the simulator does not take it: check's fix, then convert
    --rewrite-for qnn, whose proof is the real session before and after: one partition, no CPU node."""
    model = between("Celu", tmp_path / "celu.onnx", alpha=1.3)
    check = invoke("check", model, "--ep", "qnn", "--json").json()
    fix = next(f["fix"] for f in check["findings"] if f["code"] == "EP001" and f["op_type"] == "Celu")
    assert f"ortprep convert {model} --rewrite-for qnn -o {tmp_path / 'celu.qnn.onnx'}" in fix
    result = invoke("convert", model, "--rewrite-for", "qnn", "-o", tmp_path / "celu.qnn.onnx", "--json")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["verified"] is True
    proof = record["rewrite"]["proof"]
    assert proof["status"] == "proven"
    assert proof["before"]["cpu_ops"] == {"Celu": 1} and proof["before"]["partitions"] == 2
    assert proof["after"]["cpu_ops"] == {} and proof["after"]["partitions"] == 1
    assert proof["after"]["nodes_on_ep"] == proof["after"]["nodes"] > proof["before"]["nodes_on_ep"]
    assert proof["before"]["copies"] > proof["after"]["copies"]
    assert not any(f["code"] == "CNV019" for f in record["findings"])
    human = invoke("convert", model, "--rewrite-for", "qnn", "-o", tmp_path / "celu.qnn.onnx", "--force").stdout
    assert "qnn (real session here):" in " ".join(human.split())


@needs_qnn
def test_rewritten_nodes_the_real_session_leaves_on_the_cpu_are_named(tmp_path, monkeypatch):
    """A Softsign written with a LayerNormalization over two axes beside it, times zero (the same
    values): QNN's table takes every op by name, the simulator not that LayerNormalization (measured
    above), so the real session leaves it on the CPU: CNV019 names it."""
    def with_layer_norm(node, emit):
        x = node.input[0]
        softsign = emit.node("Div", [x, emit.node("Add", [emit.node("Abs", [x]), emit.const(1.0)])])
        norm = emit.node("LayerNormalization", [x, emit.const(np.ones((4, 4)))], axis=-2)
        emit.node("Add", [softsign, emit.node("Mul", [norm, emit.const(0.0)])], out=node.output[0])
        return True

    odd = Decomposition("softsign-odd", "Softsign", ("Abs", "Add", "Div", "LayerNormalization", "Mul"), (17, None),
                        with_layer_norm, "x / (1 + |x|) + 0 * LayerNormalization(x)")
    monkeypatch.setattr(registry, "REGISTRY", (odd,))
    model = between("Softsign", tmp_path / "softsign.onnx")
    record = invoke("convert", model, "--rewrite-for", "qnn", "-o", tmp_path / "out.onnx", "--json").json()
    assert record["verified"] is True and record["rewrite"]["proof"]["status"] == "proven"
    assert record["rewrite"]["predicted"]["after"]["ep001"] == 0  # the table's view
    finding = next(f for f in record["findings"] if f["code"] == "CNV019")
    assert finding["message"].endswith("middle.3.LayerNormalization")


@needs_openvino
def test_convert_proves_the_rewrite_on_openvino_through_its_runtime(tmp_path):
    """OpenVINO's table has no GroupNormalization: convert --rewrite-for openvino-cpu --runtime
    openvino-cpu=PYTHON proves the placement in that environment (ORT expands the function op for
    the EP before, so both sides are on the EP: the proof shows the rewrite loses nothing)."""
    path = tmp_path / "gn.onnx"
    onnx.save(single(CASES["groupnorm-reduce"]), path)
    result = invoke("convert", path, "--rewrite-for", "openvino", "--runtime", f"openvino-cpu={OPENVINO_PYTHON}",
                    "-o", tmp_path / "gn.ov.onnx", "--json")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["rewrite"]["rewritten"][0]["rewrite"] == "groupnorm-reduce"
    proof = record["rewrite"]["proof"]
    assert proof["status"] == "proven" and proof["after"]["cpu_nodes"] == [] and proof["after"]["partitions"] == 1
    assert not any(f["code"] == "CNV019" for f in record["findings"])


@needs_qnn
def test_a_clip_with_run_time_bounds_is_rewritten_for_qnn_and_proven(tmp_path):
    """QNN gives back a Clip whose floor is computed (openWakeWord's mel front end: its ReduceMax
    less 80; QNN010); check names the rewrite, and after it the real session runs every node."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0, name="top"),
             helper.make_node("Sub", ["top", "eighty"], ["low"], name="low"),
             helper.make_node("Clip", ["x", "low"], ["y"], name="floor")]
    graph = helper.make_graph(nodes, "db_floor", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32])],
                              [onnx.numpy_helper.from_array(np.array(80.0, np.float32), "eighty")])
    model = tmp_path / "floor.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ir_for(17)), model)
    check = invoke("check", model, "--ep", "qnn", "--json").json()
    found = next(f for f in check["findings"] if f["code"] == "QNN010")
    assert found["node"] == "floor" and "--rewrite-for qnn" in found["fix"] and "Min(Max(x, low), high)" in found["fix"]
    result = invoke("convert", model, "--rewrite-for", "qnn", "-o", tmp_path / "floor.qnn.onnx", "--json")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["verified"] is True
    proof = record["rewrite"]["proof"]
    assert proof["status"] == "proven"
    assert proof["before"]["cpu_ops"] == {"Clip": 1} and proof["after"]["cpu_ops"] == {}
    assert proof["after"]["nodes_on_ep"] == proof["after"]["nodes"] and proof["after"]["partitions"] == 1
    ops = [n.op_type for n in onnx.load(str(tmp_path / "floor.qnn.onnx")).graph.node]
    assert "Clip" not in ops and "Max" in ops
