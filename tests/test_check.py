from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import models
from cli_helpers import invoke
from conftest import SAMPLE_MODELS, SAMPLES
from ortprep.analysis import ModelAnalysis
from ortprep.eps.partition import partition_graph
from ortprep.eps.registry import EPS, resolve_ep
from ortprep.errors import UsageError
from ortprep.model import ModelHandle
from ortprep.runtime.providers import ort_max_opset
from ortprep.steps.check import check_model

ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def with_findings(record: dict, index: int = 0) -> dict:
    """A check result with its target's findings (the JSON lists each finding once, at top level)."""
    result = dict(record["results"][index])
    result["findings"] = [f for f in record["findings"] if f["target"] == result["ep"]]
    assert len(result["findings"]) == result["finding_count"]
    return result


def result_of(path: Path, ep: str) -> dict:
    return with_findings(check_model(ModelHandle.open(path), [ep]).to_record())


def codes(result: dict) -> set[str]:
    return {f["code"] for f in result["findings"]}


def saved(tmp_path: Path, model: onnx.ModelProto, name: str = "m.onnx") -> Path:
    path = tmp_path / name
    onnx.save_model(model, str(path))
    return path


# ---------------------------------------------------------------- agreement with ONNX Runtime


def _cpu_session_ok(path: Path) -> tuple[bool, str]:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return False, str(exc)
    return True, ""


@pytest.mark.parametrize(
    "path",
    SAMPLE_MODELS + sorted(ONNX_DATA.rglob("*.onnx")),
    ids=lambda p: p.name if p.is_relative_to(SAMPLES) else str(p.relative_to(ONNX_DATA)),
)
def test_cpu_verdict_matches_onnxruntime(path):
    session_ok, error = _cpu_session_ok(path)
    if not session_ok and "Failed to construct locale" in error:
        pytest.skip("this machine lacks the OS locale the StringNormalizer kernel asks for (environment, not tables)")
    result = result_of(path, "cpu")
    assert (result["verdict"] == "full") == session_ok, (result["verdict"], error, result["findings"][:3])


def test_parity_covers_failures_too():
    # The parity test must see models ORT rejects, or it could not catch a table that says yes to everything.
    assert result_of(SAMPLES / "custom_op.onnx", "cpu")["verdict"] != "full"
    assert not _cpu_session_ok(SAMPLES / "custom_op.onnx")[0]


# ---------------------------------------------------------------- every finding code: raised and not raised


def _relu_at(opset: int) -> onnx.ModelProto:
    return models.single_node(
        "Relu", [("x", TensorProto.FLOAT, [1, 4])], [("y", TensorProto.FLOAT, [1, 4])], opset=opset
    )


def _add_at(opset: int) -> onnx.ModelProto:
    spec = [("a", TensorProto.FLOAT, [1, 4]), ("b", TensorProto.FLOAT, [1, 4])]
    return models.single_node("Add", spec, [("y", TensorProto.FLOAT, [1, 4])], opset=opset)


def _conv(elem_type: int) -> onnx.ModelProto:
    return models.single_node(
        "Conv",
        [("x", elem_type, [1, 1, 4, 4]), ("w", elem_type, [1, 1, 3, 3])],
        [("y", elem_type, [1, 1, 2, 2])],
    )


def _det_only() -> onnx.ModelProto:
    return models.single_node("Det", [("x", TensorProto.FLOAT, [3, 3])], [("y", TensorProto.FLOAT, [])])


def _sample(name: str):
    return lambda: onnx.load(str(SAMPLES / name))


# code -> (builder that raises it, ep), (builder that does not, ep)
CASES = {
    "EP001": ((_sample("transformer_block.onnx"), "xnnpack"), (_sample("cnn.onnx"), "dml")),
    "EP002": ((lambda: _add_at(6), "dml"), (lambda: _add_at(17), "dml")),
    "EP003": ((lambda: _conv(TensorProto.DOUBLE), "dml"), (lambda: _conv(TensorProto.FLOAT), "dml")),
    "EP004": ((_sample("transformer_block.onnx"), "tensorrt"), (_sample("cnn.onnx"), "tensorrt")),
    "EP005": ((_sample("custom_op.onnx"), "dml"), (_sample("cnn.onnx"), "dml")),
    "EP006": ((_sample("transformer_block.onnx"), "xnnpack"), (_sample("cnn.onnx"), "dml")),
    "EP007": ((_det_only, "tensorrt"), (_sample("cnn.onnx"), "tensorrt")),
    "EP008": ((_sample("cnn_fp16.onnx"), "cpu"), (_sample("cnn.onnx"), "cpu")),
    "DML001": ((_sample("transformer_block.onnx"), "dml"), (_sample("cnn.onnx"), "dml")),
    "DML002": ((models.shape_then_cast, "dml"), (_sample("cnn.onnx"), "dml")),
    "DML003": ((lambda: models.maxpool(1), "dml"), (lambda: models.maxpool(0), "dml")),
    "DML004": ((lambda: _relu_at(21), "dml"), (lambda: _relu_at(17), "dml")),
    "NPU001": ((_sample("cnn.onnx"), "dml-npu"), (_sample("cnn_fp16.onnx"), "dml-npu")),
    "NPU003": ((_sample("conv1d_audio.onnx"), "dml-npu"), (_sample("cnn.onnx"), "dml-npu")),
    "NPU004": ((_sample("cnn.onnx"), "dml-npu"), (_sample("cnn.onnx"), "dml")),
    "SHP001": ((_sample("transformer_block.onnx"), "qnn"), (_sample("cnn.onnx"), "qnn")),
    "QNN001": ((_sample("cnn.onnx"), "qnn"), (models.qdq_relu, "qnn")),
    "TRT001": ((lambda: _relu_at(21), "tensorrt"), (lambda: _relu_at(17), "tensorrt")),
    "CMB001": ((_sample("cnn.onnx"), "openvino-cpu,dml"), (_sample("cnn.onnx"), "cuda,tensorrt")),
}


def test_qnn001_fix_loads_the_quantized_output_not_the_float_model(tmp_path):
    """The fix quantizes to MODEL.qdq.onnx and then loads that file, with the float model as the
    reference (issue 23: it loaded the original model again). Table-only: no QNN EP needed."""
    model = tmp_path / "cnn.onnx"
    model.write_bytes((SAMPLES / "cnn.onnx").read_bytes())
    fix = next(f["fix"] for f in result_of(model, "qnn")["findings"] if f["code"] == "QNN001")
    quantized = tmp_path / "cnn.qdq.onnx"
    assert f"ortprep quantize {model} --static --ep qnn" in fix and f"-o {quantized}" in fix
    assert f"ortprep load {quantized} --ep qnn --reference {model}" in fix
    assert f"ortprep load {model}" not in fix


def test_check_leaves_the_garbage_collector_as_it_found_it(tmp_path, monkeypatch):
    """check pauses the cyclic collector while it works (its per-node objects form no cycles) and
    restores it, also when the check fails and when the caller had paused it."""
    import gc

    import ortprep.steps.check as check_module

    path = saved(tmp_path, models.relu())
    assert gc.isenabled()
    check_model(ModelHandle.open(path), ["cpu"])
    assert gc.isenabled()
    with monkeypatch.context() as patch:
        def broken(*args, **kwargs):
            assert not gc.isenabled()
            raise RuntimeError("inside the check")

        patch.setattr(check_module, "check_target", broken)
        with pytest.raises(RuntimeError, match="inside the check"):
            check_model(ModelHandle.open(path), ["cpu"])
    assert gc.isenabled()
    gc.disable()
    try:
        check_model(ModelHandle.open(path), ["cpu"])
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("sample", ["cnn.onnx", "cnn_fp16.onnx", "transformer_block.onnx", "conv1d_audio.onnx",
                                    "control_flow.onnx", "custom_op.onnx"])
def test_verdicts_shared_between_nodes_are_each_nodes_own(sample):
    """check evaluates a node's rules only where they read the node (reads_the_node), and shares
    the match's verdict between the others: every EP's verdicts equal evaluating each node."""
    from ortprep.eps.rules import evaluate_node
    from ortprep.runtime.kernels import support_table
    from ortprep.prediction import _verdicts, analysis_matches

    analysis = ModelAnalysis(ModelHandle.open(SAMPLES / sample))
    graph = analysis.handle.graph
    graph_io = ({v.name for v in graph.input}, {v.name for v in graph.output})
    for spec in EPS:
        table = support_table(spec.name)
        alone = [evaluate_node(spec, table, node, found, graph_io)
                 for node, found in zip(analysis.all_nodes(), analysis_matches(table, analysis))]
        if spec.name == "qnn" and len(analysis.graphs) > 1:
            from ortprep.eps.qnn_rules import qnn_control_flow

            alone = qnn_control_flow(analysis, alone)
        assert _verdicts(spec, table, analysis) == alone, spec.name


@pytest.mark.parametrize("declared", [(TensorProto.FLOAT, [3]), (TensorProto.INT64, [2])], ids=["shape", "type"])
def test_checker_failure_found_only_by_shape_inference_is_still_mod001(tmp_path, declared):
    """check's own strict shape inference stands in for the full checker's: where it passes the
    checker runs without it, where it fails (a declared output shape or type the op cannot make:
    the plain checker passes it, the full one does not) the full checker still decides MOD001."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", *declared)])
    path = saved(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    onnx.checker.check_model(str(path))  # the plain checker passes it
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(str(path), full_check=True)
    assert ModelAnalysis(ModelHandle.open(path), strict_inference=True).strict_inference_passed is False
    finding = next(f for f in result_of(path, "cpu")["findings"] if f["code"] == "MOD001")
    assert "onnx.checker rejects the model" in finding["message"]
    valid = saved(tmp_path, models.relu(), "valid.onnx")
    assert ModelAnalysis(ModelHandle.open(valid), strict_inference=True).strict_inference_passed is True
    assert "MOD001" not in codes(result_of(valid, "cpu"))


@pytest.mark.parametrize("code", sorted(CASES))
def test_finding_raised_and_not(tmp_path, code):
    (raise_builder, raise_ep), (quiet_builder, quiet_ep) = CASES[code]
    raised = result_of(saved(tmp_path, raise_builder(), "raise.onnx"), raise_ep)
    assert code in codes(raised), raised["findings"]
    finding = next(f for f in raised["findings"] if f["code"] == code)
    assert finding["fix"] and finding["ep"]
    quiet = result_of(saved(tmp_path, quiet_builder(), "quiet.onnx"), quiet_ep)
    assert code not in codes(quiet), quiet["findings"]


def test_mod002_in_check(tmp_path):
    limit = ort_max_opset()
    newer = result_of(saved(tmp_path, _relu_at(limit + 1), "newer.onnx"), "dml")
    assert "MOD002" in codes(newer) and newer["verdict"] == "none"
    assert "MOD002" not in codes(result_of(saved(tmp_path, _relu_at(limit), "ok.onnx"), "dml"))


# ---------------------------------------------------------------- specific outcomes


def test_dml_npu_on_fp32_cnn_cli():
    result = invoke("check", SAMPLES / "cnn.onnx", "--ep", "dml-npu", "--json")
    assert result.exit_code == 1
    record = result.json()
    npu = next(f for f in with_findings(record)["findings"] if f["code"] == "NPU001")
    assert npu["severity"] == "error"
    assert "ortprep convert" in npu["fix"] and "--fp16" in npu["fix"]


def test_openvino_dml_combination_cli():
    result = invoke("check", SAMPLES / "cnn.onnx", "--ep", "openvino-cpu,dml", "--json")
    assert result.exit_code == 1
    target = with_findings(result.json())
    assert target["ep"] == "openvino-cpu,dml" and target["verdict"] == "none"
    combo = [f for f in target["findings"] if f["code"] == "CMB001"]
    assert combo and "memcpy" in combo[0]["message"] and "one session per EP" in combo[0]["fix"]


def test_repeated_ep_flags_are_separate_targets():
    record = invoke("check", SAMPLES / "cnn.onnx", "--ep", "openvino-cpu", "--ep", "dml", "--json").json()
    assert [r["ep"] for r in record["results"]] == ["openvino-cpu", "dml"]
    assert all("CMB001" not in codes(with_findings(record, i)) for i in range(2))


def test_fallback_node_named_and_counted(tmp_path):
    result = result_of(saved(tmp_path, models.diamond("Det")), "tensorrt")
    assert result["fallback_nodes"] == ["middle"]
    det = next(f for f in result["findings"] if f["code"] == "EP001")
    assert det["node"] == "middle" and det["op_type"] == "Det" and det["severity"] == "warning"
    # first/reshape/last run on TensorRT, but 'last' cannot join 'first' (path through the CPU)
    assert result["partitions"] == 2
    assert result["supported_nodes"] == 3 and result["verdict"] == "partial"


def test_partition_chain_and_copies(tmp_path):
    analysis = ModelAnalysis(ModelHandle.open(saved(tmp_path, models.diamond("Det"))))
    graph = analysis.graphs[0].graph
    all_on_ep = partition_graph(graph, [0, 0, 0, 0])
    assert all_on_ep.partitions == 1
    assert all_on_ep.copies == 2  # graph input in, graph output out
    middle_on_cpu = partition_graph(graph, [0, -1, 0, 0])
    assert middle_on_cpu.partitions == 2
    # x in, a out to the CPU, b0 back from the CPU, y out
    assert middle_on_cpu.copies == 4


@pytest.mark.parametrize("sample", ["cnn.onnx", "transformer_block.onnx", "control_flow.onnx", "cnn_fp16.onnx"])
def test_partition_shortcut_agrees_with_the_walk(sample):
    """One EP taking every node of a graph in topological order is answered without the walk
    (0.5 s of a 100,000-node check): the answer is the walk's, with and without folded nodes."""
    from ortprep.eps.partition import CPU, FOLDED, _topology, _walk

    analysis = ModelAnalysis(ModelHandle.open(SAMPLES / sample))
    for info in analysis.graphs:
        graph = info.graph
        assert _topology(graph).topological
        all_on_ep = [0] * len(graph.node)
        constants_folded = [FOLDED if node.op_type == "Constant" else 0 for node in graph.node]
        for assignment in (all_on_ep, constants_folded, [CPU] * len(graph.node)):
            eps = sorted({a for a in assignment if a >= 0})
            result = partition_graph(graph, assignment)
            assert (result.partitions, result.partition_of) == _walk(graph, assignment, eps)


def test_partition_walk_runs_where_the_node_order_is_not_topological(tmp_path):
    """The shortcut needs the node order to be topological; a graph listed out of order (which
    onnx's checker refuses) gets the walk."""
    from ortprep.eps.partition import _topology

    model = models.diamond("Relu")
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    path = tmp_path / "reversed.onnx"
    path.write_bytes(model.SerializeToString())
    graph = ModelHandle.open(path).graph
    assert not _topology(graph).topological
    result = partition_graph(graph, [0] * len(nodes))
    assert result.partitions == 1 and result.partition_of == [0] * len(nodes)


def test_cpu_fallback_impossible_is_error(samples):
    result = result_of(samples / "custom_op.onnx", "tensorrt")
    unknown = next(f for f in result["findings"] if f["node"] == "fancy")
    assert unknown["code"] == "EP005" and unknown["severity"] == "error"
    assert "session fails" in unknown["message"]


def test_subgraph_nodes_checked(samples):
    result = result_of(samples / "control_flow.onnx", "tensorrt")
    assert result["nodes"] == 6  # If, Loop and the four nodes of their bodies


def test_mac_share(samples):
    result = result_of(samples / "cnn.onnx", "dml")
    # conv1: 8*32*32 outputs * 3*3*3; conv2: 16*16*16 * 8*3*3; fc: 10 * 16
    assert result["macs"] == {"known": 8 * 32 * 32 * 27 + 16 * 16 * 16 * 72 + 160, "on_ep": result["macs"]["known"]}
    assert result["mac_share"] == 1.0


def test_check_reads_no_weights(tmp_path):
    folder = tmp_path / "ext"
    folder.mkdir()
    path = models.save_external(models.matmul_weights(), folder / "m.onnx")
    handle = ModelHandle.open(path)
    check_model(handle, ["dml"])
    assert not handle.weights_loaded


def test_unknown_ep_exit_2_lists_names():
    result = invoke("check", SAMPLES / "cnn.onnx", "--ep", "gpu9000")
    assert result.exit_code == 2
    assert "unknown execution provider 'gpu9000'" in result.stderr and "dml-npu" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_aliases():
    assert resolve_ep("trt").name == "tensorrt"
    assert resolve_ep("DirectML").name == "dml"
    assert resolve_ep("openvino").name == "openvino-cpu"
    with pytest.raises(UsageError):
        resolve_ep("nope")


def test_list_eps_json():
    record = invoke("check", "--list-eps", "--json").json()
    assert record["schema"] == "ortprep.eps/1"
    assert [e["name"] for e in record["eps"]] == [spec.name for spec in EPS]
    assert all(e["source"] and e["version"] and e["ops"] > 0 for e in record["eps"])


def test_check_json_schema_and_fail_on(samples):
    result = invoke("check", samples / "transformer_block.onnx", "--ep", "xnnpack", "--json")
    assert result.exit_code == 0  # fallbacks are warnings
    record = result.json()
    assert record["schema"] == "ortprep.check/2"
    target = record["results"][0]
    for key in ("ep", "nodes", "supported_nodes", "partitions", "copies", "fallback_nodes", "verdict", "finding_count"):
        assert key in target
    assert "findings" not in target  # each finding once, at top level, tagged with its target
    assert set(record["findings"][0]) == {
        "code",
        "severity",
        "message",
        "node",
        "op_type",
        "ep",
        "fix",
        "source",
        "target",
    }
    assert invoke("check", samples / "transformer_block.onnx", "--ep", "xnnpack", "--fail-on", "warning").exit_code == 1
    assert invoke("check", samples / "cnn.onnx", "--ep", "cpu", "--fail-on", "warning").exit_code == 0


def test_human_output_groups_findings(samples):
    result = invoke("check", samples / "transformer_block.onnx", "--ep", "xnnpack")
    assert "Add 7" in result.stdout and "the EP has no kernel for the op" in result.stdout
    assert result.stdout.count("EP001") == 1  # one line per cause, not per node or op


def test_check_without_model_or_ep():
    assert invoke("check").exit_code == 2
    assert invoke("check", SAMPLES / "cnn.onnx").exit_code == 2


def test_bad_model_exit_2(tmp_path):
    result = invoke("check", tmp_path / "missing.onnx", "--ep", "dml")
    assert result.exit_code == 2 and "not found" in result.stderr


def test_generated_tables_carry_sources():
    data = Path(__file__).resolve().parents[1] / "ortprep" / "eps" / "data"
    for path in sorted(data.glob("*.json")):
        if path.name in ("eps.json", "ort_versions.json", "devices.json", "cuda_cpu_memory.json"):
            # facts that are not op tables: see test_ep_facts_carry_sources and tests/test_real_eps.py
            if path.name == "cuda_cpu_memory.json":
                assert json.loads(path.read_text())["source"].startswith("microsoft/onnxruntime")
            continue
        table = json.loads(path.read_text())
        assert table["sources"], path.name
        for entry in table["entries"]:
            assert entry["src"] in table["sources"], (path.name, entry)


def test_patterns_measured_to_fail_on_a_device_are_predicted(tmp_path):
    """A depthwise Conv with strides [2, 1] and a ReduceSum feeding a Mul were measured to fail the
    QNN session at finalize on the Snapdragon 888 (soc_model 30) and to finalize on newer SoCs:
    check predicts "none" there (QNN004, naming the node) and "full" on the default device."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], group=8, strides=[2, 1], pads=[1, 1, 1, 1], name="dw"),
            helper.make_node("ReduceSum", ["c", "axes"], ["s"], keepdims=1, name="sum"),
            helper.make_node("Mul", ["s", "inv"], ["m"], name="mean"),
            helper.make_node("Sub", ["c", "m"], ["y"], name="center"),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([-1], np.int64), "axes"),
            numpy_helper.from_array(np.array(0.125, np.float32), "inv"),
        ],
    )
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    older = invoke("check", path, "--ep", "qnn", "--device", "sm8350", "--json")
    assert older.exit_code == 1
    record = older.json()
    assert record["results"][0]["verdict"] == "none" and record["results"][0]["device"]["provider_options"] == {
        "soc_model": "30"
    }
    named = {f["node"]: f for f in record["findings"] if f["code"] == "QNN004"}
    assert (
        set(named) == {"dw", "sum"}
        and "MEASURED" not in named["dw"]["source"]
        and "soc_model unset or 30" in named["dw"]["source"]
    )
    # the 8cx Gen 3 refuses the Conv (measured), not the ReduceSum
    assert {f["node"] for f in invoke("check", path, "--ep", "qnn", "--device", "8cx-gen3", "--json").json()["findings"]
            if f["code"] == "QNN004"} == {"dw"}
    default = invoke("check", path, "--ep", "qnn", "--json").json()
    assert default["results"][0]["verdict"] == "full" and not any(f["code"] == "QNN004" for f in default["findings"])


def test_devices_carry_sources_and_resolve():
    from ortprep.eps.devices import device_facts, resolve_device

    facts = device_facts()
    for name, entry in facts["qnn"]["devices"].items():
        assert entry["source"] in facts["sources"], name
        assert resolve_device("qnn", name).provider_options == {"soc_model": str(entry["soc_model"])}
    assert resolve_device("qnn", "SM8650").name == "8gen3" and resolve_device("qnn", "888").provider_options == {
        "soc_model": "30"
    }
    assert resolve_device("qnn", "soc_model=57").name == "8gen3" and resolve_device("qnn", "57").name == "8gen3"
    unknown = resolve_device("qnn", "soc_model=99")
    assert unknown.provider_options == {"soc_model": "99"} and unknown.given == "--device"
    default = resolve_device("qnn", None)
    assert default.name == facts["qnn"]["default"] == "x-elite" and default.given == "default"
    assert resolve_device("qnn", None, {"soc_model": "43"}).name == "8gen2"
    assert resolve_device("openvino-cpu", None) is None


def test_ep_facts_carry_sources():
    from ortprep.eps.registry import ep_facts

    facts = ep_facts()
    for entry in facts["eps"]:
        for key in ("install", "quantize", "static_shapes", "fp16_io"):
            if key in entry and key != "static_shapes":
                assert entry[key]["source"] in facts["sources"], (entry["name"], key)
        if "static_shapes" in entry:
            table = json.loads(
                (Path(__file__).resolve().parents[1] / "ortprep" / "eps" / "data" / f"{entry['name']}.json").read_text()
            )
            assert any(c["id"] == entry["static_shapes"]["constraint"] for c in table["constraints"]), entry["name"]
    assert all(key.strip() in facts["sources"] for key in facts["gpu_libraries"]["source"].split(";"))


def test_symbolic_shape_inference_types_contrib_outputs(tmp_path):
    pytest.importorskip("sympy", reason="ORT's symbolic shape inference needs sympy (installed by the dev extra)")
    from onnx import TensorProto, helper

    model = models.contrib_op()
    model.graph.node.append(helper.make_node("Relu", ["y"], ["z"], name="after"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    path = saved(tmp_path, model)
    assert onnx.shape_inference.infer_shapes(model).graph.value_info == []  # onnx alone cannot type 'y'
    from ortprep.runtime.shapes import symbolic_infer

    analysis = ModelAnalysis(ModelHandle.open(path), symbolic_infer=symbolic_infer)
    assert analysis.symbolic_used and analysis.values["y"].dtype == "float"


def _branches(cpu_between: bool) -> onnx.ModelProto:
    """x -> a -> [det] -> c and x -> b -> c: a node (c) that joins two EP groups."""
    from onnx import helper

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Sigmoid", ["x"], ["b"], name="b"),
    ]
    if cpu_between:
        nodes.append(helper.make_node("Neg", ["a"], ["a2"], name="between"))
    nodes.append(helper.make_node("Add", ["a2" if cpu_between else "a", "b"], ["y"], name="c"))
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_node_joining_two_ep_groups_makes_one_partition(tmp_path):
    graph = ModelAnalysis(ModelHandle.open(saved(tmp_path, _branches(False)))).graphs[0].graph
    joined = partition_graph(graph, [0, 0, 0])
    assert joined.partitions == 1 and set(joined.partition_of) == {0}
    # With a CPU node between a and c, c cannot join a's group (the fused node would feed the CPU
    # node that feeds it): a and b form one partition, c a second, as ORT's partitioner makes them.
    graph = ModelAnalysis(ModelHandle.open(saved(tmp_path, _branches(True), "cpu.onnx"))).graphs[0].graph
    split = partition_graph(graph, [0, 0, -1, 0])
    assert split.partitions == 2 and split.partition_of == [0, 0, -1, 1]


def test_qdq_weights_do_not_split_partitions(tmp_path):
    """Every weight of a QDQ model has its own DequantizeLinear; they all join the EP's one group."""
    from onnx import helper, numpy_helper

    nodes, inits = [], []
    current = "x"
    for i in range(4):
        inits += [numpy_helper.from_array(np.full((2, 2), i + 1, np.int8), f"w{i}_q"),
                  numpy_helper.from_array(np.array(0.1, np.float32), f"w{i}_s")]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_s"], [f"w{i}"], name=f"dq{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        current = f"m{i}"
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [2, 2])], inits)
    path = saved(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert partition_graph(ModelAnalysis(ModelHandle.open(path)).graphs[0].graph, [0] * 8).partitions == 1


def test_constant_subgraphs_are_folded_like_ort(tmp_path):
    """ORT folds nodes whose inputs are all constant (and Shape of a static tensor) before any EP
    sees the graph; check counts neither as placed nor as fallbacks. Q/DQ are never folded."""
    from onnx import helper, numpy_helper

    nodes = [
        helper.make_node("Reshape", ["w", "shape"], ["w2"], name="fold_reshape"),  # constant inputs: folded
        helper.make_node("Shape", ["x"], ["xs"], name="fold_shape"),  # static input: folded
        helper.make_node("DequantizeLinear", ["q", "s"], ["dq"], name="keep_dq"),  # never folded
        helper.make_node("Add", ["x", "w2"], ["a"], name="keep_add"),
        helper.make_node("Mul", ["a", "dq"], ["y"], name="keep_mul"),
    ]
    inits = [
        numpy_helper.from_array(np.ones(4, np.float32), "w"),
        numpy_helper.from_array(np.array([1, 4]), "shape"),
        numpy_helper.from_array(np.ones((1, 4), np.int8), "q"),
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
    ]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("xs", TensorProto.INT64, [2])], inits)
    path = saved(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    result = result_of(path, "cpu")
    assert result["nodes"] == 3 and result["verdict"] == "full"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    del session  # ORT takes the model as it is: the folded nodes are not an error


def _human_check(path: Path, ep: str) -> str:
    import io

    from rich.console import Console

    from ortprep.render.console import render_check

    buffer = io.StringIO()
    render_check(
        check_model(ModelHandle.open(path), [ep]).to_record(),
        Console(file=buffer, width=200, color_system=None, soft_wrap=True),
    )
    return buffer.getvalue().replace(str(path.parent), "<dir>")


def test_check_report_reads_as_a_diagnosis(tmp_path):
    """Dynamic dims and FP32 on a DirectML NPU: one line per cause, a pasteable fix naming the input
    and its sizes, and a summary that agrees with the verdict."""
    model = tmp_path / "conv1d_audio.onnx"
    model.write_bytes((SAMPLES / "conv1d_audio.onnx").read_bytes())
    text = _human_check(model, "dml-npu")
    golden = Path(__file__).parent / "golden" / "check_conv1d_audio_dml_npu.txt"
    if os.environ.get("ORTPREP_UPDATE_GOLDEN"):
        golden.write_text(text)
        pytest.fail(f"golden file {golden.name} rewritten; review the diff and rerun without ORTPREP_UPDATE_GOLDEN")
    assert text == golden.read_text()
    assert [line.split()[1] for line in text.splitlines() if line.startswith("  error")] == [
        "DML001",
        "NPU001",
        "SHP001",
    ]
    assert "--fix-shape audio=1,1,1024" in text and "NAME=VALUE" not in text
    assert "dml-npu: not as it is" in text and "3 problem(s) block it" in text and "partial" in text
    assert "5 problems: 3 errors, 1 warning, 1 note; 8 nodes affected" in text


@pytest.mark.parametrize(
    "args",
    [
        ("check", SAMPLES / "cnn.onnx", "--ep", "qnn", "--ep", "dml-npu", "--ep", "openvino-cpu"),
        ("check", "--list-eps"),
        ("inspect", SAMPLES / "transformer_block.onnx"),
    ],
)
def test_tables_fit_80_columns_without_cutting_headers(args):
    """On an 80-column terminal every table line fits, and no header or cell is cut short with an
    ellipsis (issue 23: 'partiti…', 'fallbac…')."""
    out = invoke(*args, env={"COLUMNS": "80"}).stdout
    table_lines = [line for line in out.splitlines() if line[:1] in "┏┃│┡└"]
    assert table_lines and max(len(line) for line in table_lines) <= 80
    assert "…" not in "\n".join(table_lines)


def _shape_computation(tmp_path: Path, buffer: int, dtype: int = TensorProto.FLOAT) -> Path:
    """x [n, 4] -> Reshape(x, Concat(Gather(Shape(x), 0), [4])) -> Add(buffer) -> y, and a side
    branch that adds a constant to the length: the CUDA EP's own rule decides where each runs."""
    from onnx import helper, numpy_helper

    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"], name="shape"),
            helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0, name="length"),
            helper.make_node("Concat", ["n", "four"], ["dims"], axis=0, name="dims"),
            helper.make_node("Reshape", ["x", "dims"], ["flat"], name="reshape"),
            helper.make_node("Add", ["flat", "bias"], ["y"], name="add_bias"),
            helper.make_node("Cast", ["n"], ["n_float"], to=dtype, name="length_as_float"),
            helper.make_node("Add", ["n_float", "buffer"], ["z"], name="add_buffer"),
        ],
        "shape_computation",
        [helper.make_tensor_value_info("x", dtype, ["n", 4])],
        [helper.make_tensor_value_info("y", dtype, ["n", 4]), helper.make_tensor_value_info("z", dtype, [buffer])],
        [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([4], np.int64), "four"),
            numpy_helper.from_array(np.ones(4, np_dtype), "bias"),
            numpy_helper.from_array(np.ones(buffer, np_dtype), "buffer"),
        ],
    )
    path = tmp_path / f"shape_{buffer}_{dtype}.onnx"
    onnx.save(models.make(graph), path)
    return path


def test_cuda_gives_small_shape_computations_to_the_cpu_as_ort_does(tmp_path):
    """ORT's CUDA EP returns a Gather on a Shape's output, and what follows it on small constants,
    to the CPU (GetCpuPreferredNodes; measured on onnxruntime-gpu 1.31.1: a GPT-2-like decoder's
    length Gather and Concat ran on the CPU). Reshape takes its shape in CPU memory and stays on
    CUDA; an Add with a 101-element constant stays; with 100 elements it moves."""
    small = result_of(_shape_computation(tmp_path, 100), "cuda")
    assert set(small["fallback_nodes"]) == {"length", "dims", "length_as_float", "add_buffer"}
    assert "EP010" in codes(small) and "EP001" not in codes(small)
    assert "EP006" not in codes(small)  # ORT's own choice, not a want of the EP: no coverage warning
    assert small["verdict"] == "partial"
    large = result_of(_shape_computation(tmp_path, 101), "cuda")
    assert set(large["fallback_nodes"]) == {"length", "dims", "length_as_float"}
    half = result_of(_shape_computation(tmp_path, 100, TensorProto.FLOAT16), "cuda")
    # a node with a float16 input is never moved: the Cast (int64 in) moves, the Add after it stays
    assert set(half["fallback_nodes"]) == {"length", "dims", "length_as_float"}
    # other EPs keep their own rules: nothing moves on the CPU EP's neighbours
    assert "EP010" not in codes(result_of(_shape_computation(tmp_path, 100), "openvino-cpu"))
    assert "EP010" not in codes(result_of(SAMPLES / "cnn.onnx", "cuda"))


def test_an_output_declared_minus_one_behind_static_inputs_is_static(tmp_path):
    """PaddlePaddle's exports declare "any" as -1 on their outputs (PP-OCR's classifier: [-1, 2]);
    behind static inputs inference finds the size, and check reads it: measured on the journey, the
    real QNN session took every node where the table had left the last one to the CPU ("Cannot get
    shape")."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
            helper.make_node("Identity", ["m"], ["y"], name="out"),
        ],
        "paddle_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")],
    )
    path = tmp_path / "paddle_out.onnx"
    onnx.save(models.make(graph, check=False), str(path))  # (onnx's full checker refuses the -1 itself)
    record = invoke("check", path, "--ep", "qnn", "--json").json()
    result = record["results"][0]
    assert result["fallback_nodes"] == [] and result["verdict"] == "full", result["fallback_nodes"]
    assert not [f for f in record["findings"] if f["code"] == "QNN002"]


def test_a_dim_check_cannot_size_is_a_placeholder_in_the_fix(tmp_path):
    """SHP001's fix guesses a batch (1), a sequence (128) and an image's sides (640); any other dim
    is written in capitals, its own name or the input's and the axis, not a made-up number (a
    'samples' of 256 was below openwakeword's STFT kernel of 512). Pasted as it is, convert says
    what the placeholder stands for, exit 2, and writes nothing."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["audio"], ["a"], name="r1"),
                               helper.make_node("Relu", ["state"], ["s"], name="r2")], "dims",
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "samples"]),
                               helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, None, 128])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "samples"]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, None, 128])])
    model = tmp_path / "dims.onnx"
    onnx.save(models.make(graph), str(model))
    record = invoke("check", model, "--ep", "qnn", "--json").json()
    fix = next(f["fix"] for f in record["findings"] if f["code"] == "SHP001")
    assert "--fix-shape audio=1,SAMPLES --fix-shape state=2,STATE_DIM1,128" in fix
    assert "(SAMPLES, STATE_DIM1: your sizes; pick the sizes you deploy with)" in fix
    pasted = invoke("convert", model, "--fix-shape", "audio=1,SAMPLES", "-o", tmp_path / "s.onnx")
    assert pasted.exit_code == 2 and "'SAMPLES' stands for a size of yours" in pasted.stderr
    assert len(pasted.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.onnx").exists()


@pytest.mark.parametrize("source", ["QNNExecutionProvider", "QNN", "qnn"])
def test_an_ep_context_node_runs_on_the_ep_that_compiled_it(tmp_path, source):
    """compile's output is one EPContext node (com.microsoft) whose 'source' names the EP that wrote
    it; ORT's QNN EP reads it without regard to case, as 'qnn' or 'QNNExecutionProvider'. check puts
    it on that EP (it said 'none', and QNN001 'a float model'), and on no other."""
    from onnx import TensorProto, helper

    node = helper.make_node("EPContext", ["x"], ["y"], name="ctx", domain="com.microsoft", main_context=1, embed_mode=1,
                            ep_cache_context=b"opaque", source=source)
    graph = helper.make_graph([node], "compiled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=9
    )
    path = tmp_path / "ctx.onnx"
    onnx.save(model, str(path))
    record = invoke("check", path, "--ep", "qnn", "--json").json()
    target = record["results"][0]
    assert target["verdict"] == "full" and target["supported_nodes"] == 1
    assert not {f["code"] for f in record["findings"]} & {"QNN001", "EP001", "EP005", "EP007"}
    other = invoke("check", path, "--ep", "openvino-cpu", "--json").json()
    refusal = next(f for f in other["findings"] if f["code"] == "EP001")
    assert refusal["node"] == "ctx" and f"compiled for {source}" in refusal["message"]
    assert other["results"][0]["verdict"] == "none"


def test_a_verdict_that_differs_with_no_node_placed_otherwise_names_the_absent_nodes():
    """compare_prediction against a session's assignment: a node check placed on the EP that the
    session's graph does not hold (ORT's optimizer removed or fused it) is named in
    predicted_on_ep_absent; the verdicts differ though no node that both know is placed otherwise
    (PP-OCR's dynamic classifier: 4 predicted on QNN, none left)."""
    from ortprep.analysis import ModelAnalysis
    from ortprep.eps.registry import resolve_ep
    from ortprep.model import ModelHandle
    from ortprep.steps.check import check_target, predicted_ep_nodes
    from ortprep.prove.proof import compare_prediction

    analysis = ModelAnalysis(ModelHandle.open(SAMPLES / "cnn.onnx"))
    spec = resolve_ep("qnn")
    predicted, _ = check_target(analysis, (spec,))
    on_ep = predicted_ep_nodes(analysis, predicted)
    assert on_ep and predicted["verdict"] in ("full", "partial")
    # the session: every node check placed on the EP is gone but one, which the CPU runs
    kept = sorted(on_ep)[0]
    comparison, differing = compare_prediction(analysis, spec, predicted, {kept: "CPUExecutionProvider"}, [], on_ep)
    assert comparison["actual_verdict"] == "none" and [node for node, _, _ in differing] == [kept]
    assert comparison["predicted_on_ep_absent"] == sorted(on_ep - {kept})
