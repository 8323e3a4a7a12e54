"""convert --rewrite-for EP (ortprep/transforms/decompose): each decomposition computes what its op
computes (ORT's CPU EP, optimizations off, on seeded inputs with edge values); the choice follows
the EP's table; check's EP001 names the command; the CLI verifies, reports placement before and
after, and a refusal writes nothing."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from cli_helpers import invoke
from rewrite_cases import CASES, inputs, mobilenet_v3, single

from ortprep.runtime.kernels import support_table
from ortprep.transforms.decompose import registry
from ortprep.transforms.decompose.apply import apply_everywhere
from ortprep.transforms.decompose.base import Decomposition, schema_since
from ortprep.transforms.decompose.einsum import matmul_plan

BY_NAME = {d.name: d for d in registry.REGISTRY}


def run_cpu(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_registry_declares_what_it_replaces_produces_and_needs():
    assert len(registry.REGISTRY) >= 8 and set(CASES) == set(BY_NAME)
    assert len({d.name for d in registry.REGISTRY}) == len(registry.REGISTRY)
    for decomposition in registry.REGISTRY:
        low = decomposition.opsets[0]
        if not decomposition.domain:  # onnx holds no schema of ORT's contrib ops
            assert schema_since(decomposition.op, low) is not None, decomposition.name
        # every produced op is a standard ONNX op at the lowest opset the rewrite is written for
        assert all(schema_since(op, low) is not None for op in decomposition.produces), decomposition.name
        assert decomposition.record()["produces"] == list(decomposition.produces)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_decomposition_computes_its_op(name):
    case, decomposition = CASES[name], BY_NAME[name]
    model = single(case)
    x = inputs(case)
    expected = run_cpu(model, x)
    assert apply_everywhere(model, decomposition) == ["node"]
    assert {n.op_type for n in model.graph.node} <= set(decomposition.produces)
    assert not any(init.name in case.constants for init in model.graph.initializer
                   if not any(init.name in n.input for n in model.graph.node))  # nothing left unread
    if not case.domain:
        onnx.checker.check_model(model, full_check=True)
    got = run_cpu(model, x)
    assert np.isfinite(got).all() == np.isfinite(expected).all()
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)


def test_forms_a_decomposition_does_not_handle_stay_as_they_are():
    # a per-channel PRelu slope is no LeakyRelu
    per_channel = single(CASES["prelu-leakyrelu"].__class__(
        "PRelu", constants={"slope": np.linspace(0.1, 0.8, 8, dtype=np.float32).reshape(8, 1, 1)}))
    assert apply_everywhere(per_channel, BY_NAME["prelu-leakyrelu"]) == []
    # LayerNormalization computes a float16 input in float32: a float16 decomposition would differ
    half = single(CASES["layernorm-reduce"], elem_type=TensorProto.FLOAT16)
    assert apply_everywhere(half, BY_NAME["layernorm-reduce"]) == []
    # the tanh form is for approximate='tanh' only, the Erf form for 'none' only
    assert apply_everywhere(single(CASES["gelu-tanh"]), BY_NAME["gelu-erf"]) == []
    assert apply_everywhere(single(CASES["gelu-erf"]), BY_NAME["gelu-tanh"]) == []
    # a GroupNormalization whose channels are not known
    dynamic = single(CASES["groupnorm-reduce"], shape=[2, "C", 4, 4])
    assert apply_everywhere(dynamic, BY_NAME["groupnorm-reduce"]) == []


@pytest.mark.parametrize("equation, plan", [
    ("ij,jk->ik", ([0, 1], [0, 1], [0, 1])),
    ("bij,bjk->bik", ([0, 1, 2], [0, 1, 2], [0, 1, 2])),
    ("bhqd,bhkd->bhqk", ([0, 1, 2, 3], [0, 1, 3, 2], [0, 1, 2, 3])),
    ("ik,jk->ji", ([0, 1], [1, 0], [1, 0])),
    ("ij,jk", ([0, 1], [0, 1], [0, 1])),
    ("ii->i", None), ("ij->ji", None), ("ij,jk,kl->il", None), ("...ij,...jk->...ik", None),
    ("ijk,jkl->il", None),  # two contracted letters
    ("ij,kj->i", None),  # a free letter of B summed away
])
def test_einsum_plans_only_single_contraction_products(equation, plan):
    assert matmul_plan(equation) == plan


def test_the_choice_follows_the_eps_own_table():
    # DirectML takes HardSigmoid and Mul: HardSwish as x * HardSigmoid(x)
    assert registry.choose(support_table("dml-npu"), "", "HardSwish", 17).name == "hardswish-hardsigmoid"
    # NNAPI takes neither HardSwish nor HardSigmoid, but Mul, Add and Clip
    assert not registry.ep_takes(support_table("nnapi"), "HardSigmoid", 17)
    assert registry.choose(support_table("nnapi"), "", "HardSwish", 17).name == "hardswish-clip"
    # written for an opset range: HardSwish does not exist before 14, Clip's bounds are inputs from 11
    assert registry.choose(support_table("dml-npu"), "", "HardSwish", 13) is None
    assert registry.choose(support_table("dml-npu"), "", "HardSigmoid", 10) is None
    # QNN's table has no Erf: ORT's contrib Gelu has no decomposition QNN takes
    assert registry.choose(support_table("qnn"), "com.microsoft", "Gelu", 17) is None
    assert registry.choose(support_table("qnn"), "", "Celu", 17).name == "celu-exp"


def test_mobilenet_v3_for_dml_npu_check_fix_rewrite_and_check_again(tmp_path):
    """The acceptance: check prints the rewrite fix; after it no EP001 remains for HardSwish or
    HardSigmoid, partitions and copies drop, and the output is verified."""
    model = mobilenet_v3(tmp_path / "mnv3.onnx")
    before = invoke("check", model, "--ep", "dml-npu", "--json").json()
    hard = [f for f in before["findings"] if f["code"] == "EP001" and f["op_type"] in ("HardSwish", "HardSigmoid")]
    assert len(hard) == 4 and {f["op_type"] for f in hard} == {"HardSwish"}
    out = tmp_path / "mnv3.dml-npu.onnx"
    assert all(f["fix"].startswith(f"ortprep convert {model} --rewrite-for dml-npu -o {out} ") for f in hard)
    text = invoke("check", model, "--ep", "dml-npu").stdout
    assert "--rewrite-for dml-npu" in " ".join(text.split())

    result = invoke("convert", model, "--rewrite-for", "dml-npu", "-o", out, "--json")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["schema"] == "ortprep.convert/1" and record["verified"] is True and out.exists()
    rewrite = record["rewrite"]
    assert [r["rewrite"] for r in rewrite["rewritten"]] == ["hardswish-hardsigmoid"] * 4 and rewrite["left"] == []
    predicted = rewrite["predicted"]
    assert predicted["before"]["ep001_ops"] == {"HardSwish": 4} and predicted["after"]["ep001"] == 0
    assert predicted["before"]["partitions"] == 5 > predicted["after"]["partitions"] == 1
    assert predicted["before"]["copies"] > predicted["after"]["copies"]
    assert predicted["after"]["nodes_on_ep"] == predicted["after"]["nodes"] == 36
    # DirectML does not run on this machine: the proof says so, it is not faked
    assert rewrite["proof"]["status"] == "unavailable"
    assert not any(f["code"] in ("CNV018", "CNV019") for f in record["findings"])

    after = invoke("check", out, "--ep", "dml-npu", "--json").json()
    assert not [f for f in after["findings"] if f["code"] == "EP001"]
    assert after["results"][0]["partitions"] == 1

    human = invoke("convert", model, "--rewrite-for", "dml-npu", "-o", out, "--force").stdout
    assert "dml-npu (check's tables): 28/32 nodes on the EP, 5 partition(s)" in " ".join(human.split())
    assert "not proven" in human


def test_check_names_a_rewrite_only_where_one_applies(tmp_path):
    """Det has no decomposition, and a GroupNormalization over unknown channels is a form none
    handles: their EP001 fixes stay the general words; a GroupNormalization of known channels gets
    the command."""
    det = tmp_path / "det.onnx"
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Det", ["x"], ["y"], name="det")], "det",
        [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), det)
    dynamic, static = tmp_path / "gn_dynamic.onnx", tmp_path / "gn.onnx"
    onnx.save(single(CASES["groupnorm-reduce"], shape=[1, "C", 4, 4]), dynamic)
    onnx.save(single(CASES["groupnorm-reduce"]), static)
    for path, rewrite in ((det, False), (dynamic, False), (static, True)):
        record = invoke("check", path, "--ep", "dml-npu", "--json").json()
        fix = next(f["fix"] for f in record["findings"] if f["code"] == "EP001")
        assert ("--rewrite-for dml-npu" in fix) is rewrite, (path, fix)
        assert rewrite or fix.startswith("replace ")


def test_a_node_no_decomposition_handles_is_left_and_said(tmp_path):
    """GroupNormalization (dml-npu has none) over a channel count the model does not fix: CNV018."""
    case = CASES["groupnorm-reduce"]
    path = tmp_path / "gn.onnx"
    onnx.save(single(case, shape=[1, "C", 4, 4]), path)
    result = invoke("convert", path, "--rewrite-for", "dml-npu", "-o", tmp_path / "out.onnx", "--json")
    record = result.json()
    assert result.exit_code == 0 and record["rewrite"]["rewritten"] == []
    assert record["rewrite"]["left"][0]["op"] == "GroupNormalization"
    assert "form" in record["rewrite"]["left"][0]["why"]
    assert [f["code"] for f in record["findings"]].count("CNV018") == 1


def test_a_rewrite_that_changes_the_outputs_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    """A decomposition that computes something else (HardSwish with x / 5) fails verification."""
    def wrong(node, emit):
        gate = emit.clip01(emit.node("Add", [emit.node("Mul", [node.input[0], emit.const(0.2)]), emit.const(0.5)]))
        emit.node("Mul", [node.input[0], gate], out=node.output[0])
        return True

    broken = Decomposition("hardswish-wrong", "HardSwish", ("Mul", "Add", "Clip"), (14, None), wrong, "wrong")
    monkeypatch.setattr(registry, "REGISTRY", (broken,))
    model = mobilenet_v3(tmp_path / "mnv3.onnx")
    out = tmp_path / "out.onnx"
    result = invoke("convert", model, "--rewrite-for", "dml-npu", "-o", out, "--json")
    assert result.exit_code == 1 and not out.exists()
    assert "CNV006" in {f["code"] for f in result.json()["findings"]}


def test_rewrite_for_is_an_ep_and_a_transform(tmp_path):
    model = mobilenet_v3(tmp_path / "mnv3.onnx")
    result = invoke("convert", model, "--rewrite-for", "no-such-ep", "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2 and "no-such-ep" in result.stderr
    # an alias names the EP; a config file says the same as the command line
    (tmp_path / "ortprep.toml").write_text('model = "mnv3.onnx"\n[[steps]]\nrun = "convert"\nrewrite_for = "dml-npu"\n'
                                           'output = "out.onnx"\n')
    run = invoke("run", tmp_path / "ortprep.toml", "--json")
    assert run.exit_code == 0, run.stdout
    assert run.json()["steps"][0]["report"]["rewrite"]["predicted"]["after"]["ep001"] == 0
