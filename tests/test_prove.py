"""Reducing a failing session to its culprits and finding what fixes it (ortprep/prove/), on the
real QNN HTP simulator (onnxruntime-qnn): sessions for the Snapdragon 888 (soc_model 30), where a
depthwise Conv with strides [2, 1], a HardSigmoid on a [1, C, 1, 1] gate and a ReduceSum -> Mul
each fail at graph finalize (QNN_COMMON_ERROR_MEM_ALLOC). Every session runs on a worker, as
`check --prove` builds them."""

from __future__ import annotations

import importlib.util
import platform
import shlex
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import invoke

HAVE_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None
pytestmark = [
    pytest.mark.skipif(not HAVE_QNN, reason="onnxruntime-qnn is not installed (make install adds it)"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the QNN simulator is an x86 build"),
]

DEVICE = "888"  # soc_model 30: the SoC on which the planted patterns fail


class Qnn:
    """QNN sessions on workers for one device, counted: ``fails`` for the reduction, ``session``
    for the fix search (with ORT's placement when created)."""

    def __init__(self, device: str = DEVICE) -> None:
        from ortprep.eps.registry import resolve_ep
        from ortprep.runtime.targets import ep_runtime, session_options
        from ortprep.prove.proof import session_caller

        self.spec = resolve_ep("qnn")
        self.target = ep_runtime(self.spec)
        self.options = session_options(self.target, None, device)
        self.sessions = 0
        self._session = session_caller(self.spec, self.target, 120)  # as check --prove builds them

    def session(self, path: str, options: dict[str, str] | None = None):
        self.sessions += 1
        return self._session(path, self.options if options is None else options)

    def fails(self, path: str) -> tuple[bool, str]:
        created, message, _ = self.session(path)
        return not created, message


def planted_chain(path: Path, pairs: int = 20, plant: dict[float, str] | None = None, channels: int = 8,
                  size: int = 16) -> Path:
    """Conv (1x1) / Relu pairs over [1, 8, 16, 16], with patterns planted after the pair at a share
    of the way: "dw" a depthwise Conv with strides [2, 1]; "hs" a squeeze-excite gate (GlobalAveragePool,
    HardSigmoid, Mul); "mean" a mean over the channels written out (ReduceSum, Mul by 1/C, Sub)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, current, height = [], [], "x", size
    spots = {int(pairs * share): kind for share, kind in (plant or {}).items()}

    def init(name: str, array) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    for index in range(pairs):
        weight = init(f"w{index}", (rng.standard_normal((channels, channels, 1, 1)) * 0.3).astype(np.float32))
        nodes += [helper.make_node("Conv", [current, weight], [f"c{index}"], name=f"conv{index}"),
                  helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}")]
        current = f"r{index}"
        kind = spots.get(index)
        if kind == "dw":
            weight = init("dw_w", rng.standard_normal((channels, 1, 3, 3)).astype(np.float32))
            nodes.append(helper.make_node("Conv", [current, weight], ["dw_out"], group=channels, strides=[2, 1],
                                          pads=[1, 1, 1, 1], name="culprit_dw"))
            current, height = "dw_out", height // 2
        elif kind == "hs":
            nodes += [helper.make_node("GlobalAveragePool", [current], ["se_pool"], name="se_pool"),
                      helper.make_node("HardSigmoid", ["se_pool"], ["se_gate"], alpha=0.2, beta=0.5, name="culprit_hs"),
                      helper.make_node("Mul", [current, "se_gate"], ["se_out"], name="se_scale")]
            current = "se_out"
        elif kind == "mean":
            axes = init("mean_axes", np.array([1], np.int64))
            scale = init("mean_scale", np.array(1.0 / channels, np.float32))
            nodes += [helper.make_node("ReduceSum", [current, axes], ["mean_sum"], keepdims=1, name="culprit_sum"),
                      helper.make_node("Mul", ["mean_sum", scale], ["mean_val"], name="culprit_mean"),
                      helper.make_node("Sub", [current, "mean_val"], ["centered"], name="center")]
            current = "centered"
    nodes.append(helper.make_node("Relu", [current], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "planted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, height, size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_ddmin_names_two_culprits_far_apart(tmp_path):
    """A strided depthwise Conv at 10% and a HardSigmoid gate at 90% of a 60-node chain: the search
    names exactly those two, each a set of its own (the contiguous search named the first only)."""
    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope
    from ortprep.prove.culprits import reduce_failure

    model = planted_chain(tmp_path / "far.onnx", plant={0.1: "dw", 0.9: "hs"})
    qnn = Qnn()
    with workers_scope():
        created, message, _ = qnn.session(str(model))
        assert not created and "QNN_COMMON_ERROR_MEM_ALLOC" in message
        record = reduce_failure(ModelHandle.open(model), qnn.fails, message=message)
    assert [group["nodes"] for group in record["culprits"]] == [["culprit_dw"], ["culprit_hs"]]
    assert [node["name"] for node in record["nodes"]] == ["culprit_dw", "culprit_hs"]
    assert all(group["minimal"] and "QNN_COMMON_ERROR_MEM_ALLOC" in group["message"] for group in record["culprits"])
    dw, hs = record["nodes"]
    assert dw["op_type"] == "Conv" and dw["attributes"]["strides"] == [2, 1] and dw["attributes"]["group"] == 8
    assert dw["inputs"] == ["float32[1,8,16,16]", "float32[8,1,3,3]"] and dw["outputs"] == ["float32[1,8,8,16]"]
    assert hs["op_type"] == "HardSigmoid" and hs["inputs"] == ["float32[1,8,1,1]"]
    assert "stopped" not in record and "reason" not in record
    assert record["probes"] == qnn.sessions - 1 <= record["bound"]["probes"]


def test_ddmin_reduces_a_window_to_the_pair_that_fails_together(tmp_path):
    """A ReduceSum feeding a Mul (a mean written out) fails only as a pair: the set is both, and
    neither alone (1-minimal)."""
    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope
    from ortprep.prove.culprits import reduce_failure

    model = planted_chain(tmp_path / "mean.onnx", plant={0.5: "mean"})
    qnn = Qnn()
    with workers_scope():
        _, message, _ = qnn.session(str(model))
        record = reduce_failure(ModelHandle.open(model), qnn.fails, message=message, find_all=False)
        first = record["culprits"][0]
        assert first["nodes"] == ["culprit_sum", "culprit_mean"] and first["minimal"] and first["found_by"] == "ddmin"
        assert first["with"] == []  # its axes and scale are initializers, not nodes: nothing came along
        # neither alone fails (what 1-minimal says), measured again here
        sum_only = tmp_path / "sum.onnx"
        mul_only = tmp_path / "mul.onnx"
        _save_units(model, ["culprit_sum"], sum_only)
        _save_units(model, ["culprit_mean"], mul_only)
        assert qnn.fails(str(sum_only))[0] is False and qnn.fails(str(mul_only))[0] is False


def _save_units(model: Path, names: list[str], dest: Path) -> None:
    import onnx

    from ortprep.transforms.off_ep import GraphCut

    cut = GraphCut(onnx.load(str(model)))
    units = [cut.unit_of[index] for index, node in enumerate(cut.nodes) if node.name in names]
    onnx.save(cut.probe(units), str(dest))


def test_the_bound_holds_and_a_stopped_search_says_so(tmp_path):
    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope
    from ortprep.prove.culprits import reduce_failure
    from ortprep.prove.reduction import Budget

    model = planted_chain(tmp_path / "far.onnx", plant={0.1: "dw", 0.9: "hs"})
    qnn = Qnn()
    seen: list[tuple[int, int]] = []
    with workers_scope():
        _, message, _ = qnn.session(str(model))
        before = qnn.sessions
        record = reduce_failure(
            ModelHandle.open(model),
            qnn.fails,
            message=message,
            bound=Budget(probes=5, seconds=600),
            progress=lambda done, bound: seen.append((done, bound)),
        )
        assert qnn.sessions - before == record["probes"] == 5
        assert record["stopped"].startswith("the bound of 5 sessions was reached")
        assert record["culprits"] == [] and record["nodes"] == []
        assert seen[:-1] == [(n, 5) for n in range(1, 6)] and seen[-1] == (5, 5)
        assert record["partial"]  # the smallest set known to fail so far, named
        assert all(name in {n.name for n in ModelHandle.open(model).proto.graph.node} for name in record["partial"])

        # the deadline: none left, no session started
        before = qnn.sessions
        record = reduce_failure(ModelHandle.open(model), qnn.fails, message=message, bound=Budget(probes=50, seconds=0))
        assert qnn.sessions == before and record["probes"] == 0
        assert record["stopped"].startswith("the deadline of 0 s passed")


def control_flow_model(path: Path, unknown_outer: bool = False) -> Path:
    """conv -> If (both branches read the conv's output from the outer scope) -> a strided
    depthwise Conv -> Relu. With ``unknown_outer`` the first node is com.microsoft's FusedConv,
    whose output onnx's shape inference cannot type: a probe that holds the If without it cannot
    give that value a type."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.3).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "dw_w")]
    first = (helper.make_node("FusedConv", ["x", "w0"], ["r0"], domain="com.microsoft", activation="Relu", name="conv0")
             if unknown_outer else helper.make_node("Conv", ["x", "w0"], ["r0"], name="conv0"))
    out = helper.make_tensor_value_info
    then_branch = helper.make_graph([helper.make_node("Sigmoid", ["r0"], ["t"], name="then_sigmoid")], "then", [],
                                    [out("t", TensorProto.FLOAT, [1, 8, 16, 16])])
    else_branch = helper.make_graph([helper.make_node("Relu", ["r0"], ["e"], name="else_relu")], "else", [],
                                    [out("e", TensorProto.FLOAT, [1, 8, 16, 16])])
    nodes = [
        first,
        helper.make_node("If", ["flag"], ["b"], then_branch=then_branch, else_branch=else_branch, name="branch"),
        helper.make_node("Conv", ["b", "dw_w"], ["d"], group=8, strides=[2, 1], pads=[1, 1, 1, 1], name="culprit_dw"),
        helper.make_node("Relu", ["d"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "control_flow",
        [out("x", TensorProto.FLOAT, [1, 8, 16, 16]), out("flag", TensorProto.BOOL, [])],
        [out("y", TensorProto.FLOAT, [1, 8, 8, 16])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if unknown_outer else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=9), str(path))
    return path


def test_control_flow_is_cut_around_the_if_or_says_why_not(tmp_path):
    """The If is one opaque unit (its branches come along whole; the outer-scope value they read
    becomes a probe input). onnxruntime-qnn 2.7.0 takes an If whose branches it can build (as an
    ElementWiseSelect of both), and on the 888 that If fails at finalize by itself (measured: the
    model without the depthwise Conv fails too, and is created with soc_model 60): the search names
    the If and the Conv, each alone. Where the outer value has no type shape inference knows, the
    probes that would need it are not built, and the record says which value and which node; QNN
    leaves that If to the CPU (its outer input comes from the CPU), so the Conv is the culprit."""
    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope
    from ortprep.prove.culprits import GraphCut, reduce_failure

    typed = control_flow_model(tmp_path / "if.onnx")
    untyped = control_flow_model(tmp_path / "if_fused.onnx", unknown_outer=True)
    qnn = Qnn()
    with workers_scope():
        _, message, _ = qnn.session(str(typed))
        record = reduce_failure(ModelHandle.open(typed), qnn.fails, message=message)
        assert record["control_flow"] == ["branch"] and record["units"] == 4
        assert [group["nodes"] for group in record["culprits"]] == [["branch"], ["culprit_dw"]]
        assert record["nodes"][0]["attributes"] == {"else_branch": "<subgraph 'else': 1 nodes>",
                                                    "then_branch": "<subgraph 'then': 1 nodes>"}
        assert "cut_errors" not in record
        # a probe holding the If alone is a valid model: the outer-scope value is its input
        import onnx

        cut = GraphCut(onnx.load(str(typed)))
        probe = cut.probe([cut.unit_of[1]])
        assert [v.name for v in probe.graph.input] == ["flag", "r0"] and [v.name for v in probe.graph.output] == ["b"]
        onnx.checker.check_model(probe, full_check=True)

        created, message, _ = qnn.session(str(untyped))
        assert not created and "QNN_COMMON_ERROR_MEM_ALLOC" in message
        record = reduce_failure(ModelHandle.open(untyped), qnn.fails, message=message)
        assert [group["nodes"] for group in record["culprits"]] == [["culprit_dw"]] and record["culprits"][0]["minimal"]
        assert record["cut_errors"] == ["value 'r0' read by node 'branch' (If) has no type that shape inference knows, "
                                        "so it cannot become a probe's input"]


def test_fix_search_finds_soc_model_and_its_command_works(tmp_path):
    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope
    from ortprep.prove.culprits import reduce_failure
    from ortprep.prove.fixes import find_fix

    model = planted_chain(tmp_path / "dw.onnx", pairs=4, plant={0.5: "dw"})
    qnn = Qnn()
    with workers_scope():
        _, message, _ = qnn.session(str(model))
        handle = ModelHandle.open(model)
        culprit = reduce_failure(handle, qnn.fails, message=message)
        before = qnn.sessions
        fix = find_fix(handle, culprit, qnn.session, provider=qnn.spec.provider, provider_options=qnn.options,
                       ep_label="qnn", workdir=tmp_path / "fixes", command_args=["--device", DEVICE])
    assert fix["kind"] == "provider_option" and fix["options"] == {"soc_model": "60"}
    assert fix["sessions"] == qnn.sessions - before == 1 and fix["tried"][0]["created"] is True
    assert "another SoC" in fix["note"]
    assert fix["command"] == shlex.join(["ortprep", "check", str(model), "--ep", "qnn", "--prove",
                                         "--provider-option=qnn:soc_model=60"])
    result = invoke(*shlex.split(fix["command"])[1:], "--json")
    assert result.exit_code == 0, result.stdout[-800:]
    proof = result.json()["results"][0]["proof"]
    assert proof["status"] == "created" and proof["provider_options"]["soc_model"] == "60"
    # and the same line with the original device fails: the fix is what made it work
    failing = invoke("check", model, "--ep", "qnn", "--prove", "--device", DEVICE, "--json")
    assert failing.json()["results"][0]["proof"]["status"] == "failed"


def mixed_qdq(path: Path, channels: int = 8, size: int = 16) -> Path:
    """A QDQ model (uint8 activations and weights) with a float island: a depthwise Conv with
    strides [2, 1] and float weights, and a Relu, between a DequantizeLinear and a QuantizeLinear
    (what a quantizer leaves when it excludes a node). QNN takes the float Conv and fails at
    finalize on the 888, as in a float model: removing a node's Q/DQ does not keep it off the EP."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = []

    def init(name: str, array) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def qdq(source: str, name: str) -> list:
        return [
            helper.make_node(
                "QuantizeLinear", [source, "act_scale", "act_zp"], [f"{name}_q"], name=f"{name}_QuantizeLinear"
            ),
            helper.make_node(
                "DequantizeLinear", [f"{name}_q", "act_scale", "act_zp"], [name], name=f"{name}_DequantizeLinear"
            ),
        ]

    def weight(name: str) -> list:
        init(f"{name}_q", rng.integers(100, 156, size=(channels, channels, 1, 1)).astype(np.uint8))
        return [
            helper.make_node(
                "DequantizeLinear", [f"{name}_q", "w_scale", "w_zp"], [name], name=f"{name}_DequantizeLinear"
            )
        ]

    init("act_scale", np.float32(0.05))
    init("act_zp", np.uint8(128))
    init("w_scale", np.float32(0.01))
    init("w_zp", np.uint8(128))
    init("dw_w", rng.standard_normal((channels, 1, 3, 3)).astype(np.float32))
    nodes = [
        *qdq("x", "xq"),
        *weight("w0"),
        helper.make_node("Conv", ["xq", "w0"], ["c0"], name="conv0"),
        *qdq("c0", "c0q"),
        helper.make_node(
            "Conv", ["c0q", "dw_w"], ["d"], group=channels, strides=[2, 1], pads=[1, 1, 1, 1], name="culprit_dw"
        ),
        helper.make_node("Relu", ["d"], ["dr"], name="float_relu"),
        *qdq("dr", "drq"),
        *weight("w1"),
        helper.make_node("Conv", ["drq", "w1"], ["c1"], name="conv1"),
        *qdq("c1", "y"),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed_qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size // 2, size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_graph_fix_on_a_qdq_model_is_verified(tmp_path):
    """The fix search with the device kept (no soc_model): the device-independent options do not
    help, so the culprit (with the DequantizeLinear it reads) is kept off the EP inside an If. Its
    session on the 888 is created with QNN taking the rest, and its outputs on the CPU EP equal the
    original's (graph optimizations off: the same function; at the default level within one
    quantization step of the output, because ORT quantizes the float Conv's weights in the
    original and not inside the If)."""
    import onnx
    import onnxruntime as ort

    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope
    from ortprep.prove.culprits import reduce_failure
    from ortprep.prove.fixes import find_fix

    model = mixed_qdq(tmp_path / "mixed.onnx")
    qnn = Qnn()
    with workers_scope():
        created, message, _ = qnn.session(str(model))
        assert not created and "QNN_COMMON_ERROR_MEM_ALLOC" in message
        handle = ModelHandle.open(model)
        culprit = reduce_failure(handle, qnn.fails, message=message)
        assert [group["nodes"] for group in culprit["culprits"]] == [["culprit_dw"]]
        assert culprit["culprits"][0]["with"] == ["c0q_DequantizeLinear"]  # its activation DQ came along
        fix = find_fix(handle, culprit, qnn.session, provider=qnn.spec.provider, provider_options=qnn.options,
                       ep_label="qnn", workdir=tmp_path / "fixes", command_args=["--device", DEVICE], keep_device=True)
        assert [t["candidate"] for t in fix["tried"]] == [
            "vtcm_mb=8", "htp_graph_finalization_optimization_mode=3", "keep culprit_dw off the EP"]
        assert [t["created"] for t in fix["tried"]] == [False, False, True]
        assert fix["kind"] == "graph" and fix["moved_nodes"] == ["c0q_DequantizeLinear", "culprit_dw"]
        assert (
            fix["verified"]["session"] and fix["verified"]["cpu_outputs_match"] and fix["verified"]["max_abs_diff"] == 0
        )
        assert fix["placement"]["moved_on_ep"] == [] and fix["placement"]["nodes_on_ep"] > 0
        assert fix["sessions"] == 3 + 4  # three QNN sessions, four CPU sessions to verify
        rewritten = Path(fix["model"])
        # the rewrite, measured here again: its own QNN session is created, the Conv runs on the CPU EP
        created, _, assignment = qnn.session(str(rewritten))
        assert created and assignment["culprit_dw"] == "CPUExecutionProvider"
        assert sum(ep == "QNNExecutionProvider" for ep in assignment.values()) == fix["placement"]["nodes_on_ep"]
    # outputs on the CPU EP, here, outside ortprep
    feeds = {"x": np.random.default_rng(7).standard_normal((1, 8, 16, 16)).astype(np.float32)}

    def cpu(path: Path, level) -> np.ndarray:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    off = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    np.testing.assert_array_equal(cpu(rewritten, off), cpu(model, off))
    on = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert np.abs(cpu(rewritten, on) - cpu(model, on)).max() <= 0.05 + 1e-6  # one step of y's scale
    proto = onnx.load(str(rewritten))
    onnx.checker.check_model(proto, full_check=True)
    assert [node.name for node in proto.graph.node if node.op_type == "If"] == ["ortprep_off_ep_culprit_dw"]
    assert fix["command"] == shlex.join(
        ["ortprep", "check", str(rewritten), "--ep", "qnn", "--prove", "--device", DEVICE]
    )
    result = invoke(*shlex.split(fix["command"])[1:], "--json")
    assert result.json()["results"][0]["proof"]["status"] == "created", result.stdout[-800:]


def test_check_prove_names_the_culprit_and_its_fix_command_works(tmp_path):
    """The whole user path: check --prove on the 888 names the culprit set and prints a convert
    line; that line writes a verified model (exit 0) whose own proof on the 888 is created, with
    the culprit on the CPU EP and the rest on QNN."""
    model = planted_chain(tmp_path / "dw.onnx", pairs=6, plant={0.5: "dw"})
    result = invoke("check", model, "--ep", "qnn", "--prove", "--device", DEVICE, "--json")
    assert result.exit_code == 1, result.stdout[-800:]
    record = result.json()["results"][0]
    proof = record["proof"]
    assert proof["status"] == "failed" and record["verdict"] == "none"
    assert [group["nodes"] for group in proof["culprit"]["culprits"]] == [["culprit_dw"]]
    assert proof["culprit"]["nodes"][0]["attributes"]["strides"] == [2, 1]
    fix = proof["fix"]
    # the device was named: no other SoC is offered; the graph change is
    assert fix["kind"] == "graph" and fix["kept_off"] == ["culprit_dw"]
    assert not any(t["candidate"].startswith(("soc_model", "htp_arch")) for t in fix["tried"])
    output = tmp_path / "dw.off-ep.onnx"
    assert fix["command"] == shlex.join(
        ["ortprep", "convert", str(model), "--keep-off-ep=culprit_dw", "-o", str(output)]
    )
    prv002 = next(f for f in result.json()["findings"] if f["code"] == "PRV002")
    assert "culprit_dw" in prv002["message"] and fix["command"] in prv002["fix"]
    converted = invoke(*shlex.split(fix["command"])[1:], "--json")
    assert converted.exit_code == 0 and converted.json()["verify"]["optimization"] == "disable"
    assert converted.json()["verify"]["max_abs_diff"] == 0.0
    proven = invoke(*shlex.split(fix["then"])[1:], "--json")
    again = proven.json()["results"][0]["proof"]
    assert again["status"] == "created" and "culprit_dw" in again["fallback_nodes"]
    assert again["nodes_on_ep"] >= 12  # the six Conv/Relu pairs and the last Relu stay on QNN


def test_convert_keep_off_ep_refuses_an_unknown_node_and_verifies_a_qdq_model(tmp_path):
    model = mixed_qdq(tmp_path / "mixed.onnx")
    before = model.read_bytes()
    refused = invoke("convert", model, "--keep-off-ep", "no_such_node", "-o", tmp_path / "out.onnx")
    assert refused.exit_code == 2 and "no_such_node" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "out.onnx").exists() and model.read_bytes() == before
    # the QDQ model: with graph optimizations off the rewrite computes the same values exactly
    done = invoke("convert", model, "--keep-off-ep", "culprit_dw", "-o", tmp_path / "out.onnx", "--json")
    assert done.exit_code == 0, done.stdout[-800:]
    assert done.json()["verify"]["max_abs_diff"] == 0.0 and done.json()["verify"]["optimization"] == "disable"
    assert "c0q_DequantizeLinear, culprit_dw" in done.json()["transforms"][0]["detail"]


def _bias_between_identities(folder: Path) -> Path:
    """models.bias_after_conv_transpose with an Identity after the Add too, quantized A16W16 in QDQ
    form (the CPU preset: the QNN one would fold the Add into the ConvTranspose, QNT025)."""
    import models

    model, calib = models.bias_after_conv_transpose(folder, identity_after=True)
    quantized = folder / "q.onnx"
    done = invoke(
        "quantize",
        model,
        "--static",
        "--format",
        "qdq",
        "--activation-type",
        "uint16",
        "--weight-type",
        "uint16",
        "--calib",
        calib,
        "-o",
        quantized,
        "--no-preprocess",
        "--metric",
        "y=cosine",
        "--keep-failed",
    )
    # a tiny model: not smaller (QNT003, a warning), written all the same; the QDQ file is what this needs
    assert done.exit_code == 0 and "QNT003" in done.stdout, done.stdout[-800:]
    return quantized


def test_convert_keep_off_ep_never_writes_what_a_default_session_cannot_create(tmp_path):
    """--keep-off-ep is verified with graph optimizations off; the result must also create the session
    an application gets (ORT's default level). With onnxruntime 1.32, that session aborts its process
    on this model's Add kept off the EP (measured: a vector index assertion in ORT's QDQ clean-up,
    QDQFinalCleanupTransformer; fine with it disabled, at ORT_ENABLE_BASIC and with optimizations
    off); convert then refuses and writes nothing."""
    import subprocess
    import sys

    import onnxruntime

    quantized = _bias_between_identities(tmp_path)
    out = tmp_path / "off.onnx"
    done = invoke("convert", quantized, "--keep-off-ep", "bias", "-o", out, "--keep-failed", "--json")
    kept = tmp_path / "off.failed.onnx"
    written = out if out.exists() else kept
    assert written.exists()
    session = subprocess.run([sys.executable, "-c", "import onnxruntime as o, sys; o.InferenceSession(sys.argv[1], "
                              "providers=['CPUExecutionProvider'])", str(written)], capture_output=True, text=True)
    if session.returncode == 0 and not onnxruntime.__version__.startswith("1.32"):  # an ORT that creates it
        assert done.exit_code == 0 and out.exists() and not kept.exists()
        return
    assert done.exit_code == 1 and not out.exists()
    finding = next(f for f in done.json()["findings"] if f["code"] == "CNV006")
    assert "ORT's default optimization level" in finding["message"] and "killed its process" in finding["message"]
    assert onnxruntime.__version__.startswith("1.32")  # the version this was measured on
