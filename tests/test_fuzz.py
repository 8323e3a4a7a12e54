"""Mutated models through the commands: never an internal error (exit 4), never a traceback.
A bounded run here; `make fuzz` runs 2,000 cases through subprocesses (hangs included)."""

from __future__ import annotations

import pytest

from cli_helpers import invoke
from conftest import SAMPLES
from tools.fuzz_cases import MUTATIONS, mutate
from tools.fuzz_fields import FIELD_MUTATIONS, mutate_fields

SEEDS = ["cnn.onnx", "transformer_block.onnx", "control_flow.onnx", "conv1d_audio.onnx", "custom_op.onnx"]
# Cases that once failed (seed, case number, command): kept as regression tests.
REGRESSIONS = [
    ("cnn.onnx", 10, "convert"),  # unknown domain without an opset import: shape inference raised
    ("cnn.onnx", 50, "convert"),  # an initializer whose dims disagree with its data
    ("transformer_block.onnx", 51, "convert"),  # a cycle: the topological repair met a missing producer
    ("cnn.onnx", 70, "convert"),
    ("transformer_block.onnx", 111, "convert"),
]
COMMANDS = {
    "inspect": ["inspect", "{model}", "--json"],
    "check": ["check", "{model}", "--ep", "cpu", "--ep", "dml-npu", "--ep", "qnn", "--json"],
    "convert": ["convert", "{model}", "--fp16", "--no-verify", "-o", "{out}", "--json"],
}


def _run(tmp_path, seed: str, case: int, command: str, mutator=mutate):
    kind, data = mutator((SAMPLES / seed).read_bytes(), case)
    model = tmp_path / f"case{case}.onnx"
    model.write_bytes(data)
    before = model.read_bytes()
    result = invoke(*[a.format(model=model, out=tmp_path / "out.onnx") for a in COMMANDS[command]])
    assert result.exit_code in (0, 1, 2, 3), (seed, case, kind, command, result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, (seed, case, kind, result.stderr)
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert model.read_bytes() == before  # the input is never modified
    return kind


def test_text_that_is_not_utf8(tmp_path):
    """The str/bytes case: protobuf hands back bytes for a text field that is not valid UTF-8, and
    inspect used to sort them with str (exit 4). Now every command refuses the file in one line."""
    data = (SAMPLES / "cnn.onnx").read_bytes()
    at = data.find(b"Relu")
    path = tmp_path / "bad.onnx"
    path.write_bytes(data[:at] + b"Rel\xff" + data[at + 4:])
    for args in (
        ["inspect", path],
        ["check", path, "--ep", "cpu"],
        ["convert", path, "--fp16", "-o", tmp_path / "o.onnx"],
    ):
        result = invoke(*args)
        assert result.exit_code == 2 and "not valid UTF-8" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_producer_name_that_is_not_utf8_is_no_reason_to_fail(tmp_path):
    """`make fuzz`, case 300 (cnn.onnx, flip_bytes): one byte of the producer's name flipped.
    Only the names of tensors and nodes make a graph; `check` and `load` copied the producer's
    name into the graph-only copy they infer shapes on, and protobuf refused the bytes it had
    handed back (exit 4). Now each command runs, and the name reads with U+FFFD."""
    import json

    data = (SAMPLES / "cnn.onnx").read_bytes()
    at = data.find(b"ortprep-sample-models")
    assert at > 0
    path = tmp_path / "producer.onnx"
    path.write_bytes(data[:at + 8] + b"\xb0" + data[at + 9:])
    for args in (["check", path, "--ep", "cpu"], ["load", path, "--ep", "cpu", "--runs", "1"]):
        result = invoke(*args, "--json")
        assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    shown = invoke("inspect", path, "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["producer"]["name"] == "ortprep-\ufffdample-models"


@pytest.mark.parametrize("seed, case, command", REGRESSIONS)
def test_regressions(tmp_path, seed, case, command):
    _run(tmp_path, seed, case, command)


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_bounded_fuzz(tmp_path, command):
    kinds = {_run(tmp_path, SEEDS[case % len(SEEDS)], case, command) for case in range(3 * len(MUTATIONS))}
    assert kinds == set(MUTATIONS)  # every mutation was tried


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_bounded_field_fuzz(tmp_path, command):
    """Protobuf-field mutations (tools/fuzz_fields.py), each kind once per command; `make fuzz` runs 2,000."""
    kinds = {_run(tmp_path, SEEDS[case % len(SEEDS)], case, command, mutate_fields).split("+")[0]
             for case in range(len(FIELD_MUTATIONS))}
    assert kinds == set(FIELD_MUTATIONS)


def test_field_mutations_replay_and_change_the_model():
    seeds = [(SAMPLES / name).read_bytes() for name in SEEDS]
    assert mutate_fields(seeds[2], 7) == mutate_fields(seeds[2], 7)
    changed = {mutate_fields(seed, case)[0].split("+")[0] for case in range(3 * len(FIELD_MUTATIONS))
               for seed in seeds if mutate_fields(seed, case)[1] != seed}
    assert changed == set(FIELD_MUTATIONS)


def _invalid(kind: str):
    from onnx import TensorProto, helper

    a = helper.make_node("Relu", ["x"], ["a"], name="first")
    b = helper.make_node("Neg", ["a"], ["b"], name="second")
    if kind == "duplicate_name":
        b = helper.make_node("Neg", ["a"], ["a"], name="second")  # 'a' defined twice
    elif kind == "cycle":
        a = helper.make_node("Relu", ["b"], ["a"], name="first")  # first reads second's output
    elif kind == "dangling_input":
        b = helper.make_node("Add", ["a", "nowhere"], ["b"], name="second")
    graph = helper.make_graph(
        [a, b],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b" if kind != "duplicate_name" else "a", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kind", ["duplicate_name", "cycle", "dangling_input"])
def test_invalid_models_are_errors_everywhere(tmp_path, kind):
    import onnx

    path = tmp_path / f"{kind}.onnx"
    onnx.save(_invalid(kind), str(path))
    check = invoke("check", path, "--ep", "cpu", "--ep", "dml", "--json").json()
    assert all(r["verdict"] == "none" for r in check["results"])
    assert {f["code"] for f in check["findings"] if f["severity"] == "error"} >= {"MOD001"}
    assert invoke("inspect", path).exit_code == 1
    for args in (["convert", path, "--fp16"], ["simplify", path], ["optimize", path], ["load", path, "--ep", "cpu"],
                 ["quantize", path, "--dynamic", "--calib", "random"]):
        result = invoke(*args, "-o", tmp_path / "o.onnx") if args[0] != "load" else invoke(*args)
        assert result.exit_code == 2, (args[0], result.stderr)
        assert "onnx.checker rejects the model" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "o.onnx").exists()


def test_checker_only_complaint_is_a_warning_when_ort_loads_it(tmp_path):
    """A graph output typed without a shape field: onnx's checker refuses it, ONNX Runtime loads it.
    check warns (MOD001 warning, verdict full); the other steps go on."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "noshape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(Exception):
        onnx.checker.check_model(str(path), full_check=True)
    record = invoke("check", path, "--ep", "cpu", "--json").json()
    finding = next(f for f in record["findings"] if f["code"] == "MOD001")
    assert finding["severity"] == "warning" and "loads it anyway" in finding["message"]
    assert record["results"][0]["verdict"] == "full"
    assert invoke("load", path, "--ep", "cpu", "--runs", "1").exit_code == 0


def test_fixed_shapes_pass_the_checker(tmp_path):
    """convert --fix-dim once left outputs typed without a shape (onnx's checker refused its own output)."""
    import onnx

    out = tmp_path / "static.onnx"
    assert invoke("convert", SAMPLES / "transformer_block.onnx", "--fix-dim", "batch=1", "--fix-dim", "sequence=16",
                  "-o", out).exit_code == 0
    onnx.checker.check_model(str(out), full_check=True)
    # An op shape inference knows nothing about: its output keeps the shape it had.
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Foo", ["x"], ["y"], domain="com.example", name="foo")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    custom = tmp_path / "custom.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]),
        str(custom),
    )
    assert invoke("convert", custom, "--fix-dim", "batch=1", "--no-verify", "-o", tmp_path / "c.onnx").exit_code == 0
    onnx.checker.check_model(str(tmp_path / "c.onnx"), full_check=True)
