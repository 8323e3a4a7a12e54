"""Tensor bytes against shape and type: the model gate refuses a stored tensor whose data does not fit
(issue 52: `convert --fp16` met raw bytes one element too long and exited 4, "buffer size must be a
multiple of element size"). Each malformed kind is one line and exit 2 in every command that reads a
model, naming the tensor; nothing is written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import invoke
from conftest import SAMPLE_MODELS
from models import make, matmul_weights, save_external

from ortprep.errors import ModelReadError
from ortprep.model import ModelHandle, iter_tensors
from ortprep.tensor_bytes import tensor_defect


def _raw(values, dtype=np.float32, name="w") -> TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _with(tensor: TensorProto, **changes) -> TensorProto:
    for key, value in changes.items():
        if key == "dims":
            del tensor.dims[:]
            tensor.dims.extend(value)
        else:
            setattr(tensor, key, value)
    return tensor


MALFORMED = {
    "raw one element short of a byte": (lambda: _with(_raw([1, 2]), raw_data=_raw([1, 2]).raw_data + b"abc"),
                                        "raw_data holds 11 bytes, its shape [2] and type float need 8"),
    "raw too short": (lambda: _with(_raw([1, 2]), raw_data=b"\0" * 4), "raw_data holds 4 bytes"),
    "dims past the data": (lambda: _with(_raw([1, 2]), dims=[3]), "raw_data holds 8 bytes, its shape [3]"),
    "type wider than the data": (lambda: _with(_raw([1, 2]), data_type=TensorProto.DOUBLE), "type double need 16"),
    "unknown type": (lambda: _with(_raw([1, 2]), data_type=99), "element type 99 is not an ONNX type"),
    "undefined type": (lambda: _with(_raw([1, 2]), data_type=0), "element type 0 is not an ONNX type"),
    "negative dim": (lambda: _with(_raw([1, 2]), dims=[-2]), "negative dimension"),
    "float_data short": (lambda: _with(helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0]), dims=[2]),
                         "float_data holds 1 values, its shape [2] and type float need 2"),
    "int64 in float_data": (lambda: _typed_elsewhere(), "its data is in int64_data, which does not hold type float"),
    "no data": (lambda: _with(TensorProto(name="w", data_type=TensorProto.FLOAT), dims=[4]), "it holds no data"),
    "string with raw": (lambda: _with(TensorProto(name="s", data_type=TensorProto.STRING, raw_data=b"abcd"), dims=[1]),
                        "string tensor with raw_data"),
    "string count": (lambda: _with(helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"b"]), dims=[3]),
                     "string_data holds 2 values, its shape [3] and type string need 3"),
    "int4 raw short": (lambda: _with(helper.make_tensor("q", TensorProto.INT4, [5], [1, 2, 3, 4, 5], raw=False),
                                     dims=[7]), "int32_data holds 3 values, its shape [7] and type int4 need 4"),
    "int4 packed raw": (lambda: _with(TensorProto(name="q", data_type=TensorProto.INT4, raw_data=b"\0\0"), dims=[5]),
                        "raw_data holds 2 bytes, its shape [5] and type int4 need 3"),
    "complex64 counts pairs": (lambda: _with(helper.make_tensor("c", TensorProto.COMPLEX64, [2], [1 + 2j, 3j]),
                                             dims=[3]), "float_data holds 4 values, its shape [3] and type complex64 "
                                                        "need 6"),
    "external length": (lambda: _external(length="12"), "its external-data length is 12 bytes, its shape [2] and "
                                                        "type float need 8"),
    "external offset": (lambda: _external(offset="-4"), "its external-data offset '-4' is not a byte count"),
    "external superscript": (lambda: _external(length="\u00b2"), "length '\u00b2' is not a byte count"),
}


def _typed_elsewhere() -> TensorProto:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT)
    tensor.dims.append(2)
    tensor.int64_data.extend([1, 2])
    return tensor


def _external(**entries) -> TensorProto:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL)
    tensor.dims.append(2)
    for key, value in {"location": "w.bin", **entries}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_tensors_are_named(kind):
    build, expected = MALFORMED[kind]
    defect = tensor_defect(build())
    assert defect is not None and expected in defect, defect


VALID = [
    _raw([1, 2, 3]), _raw([], name="empty"), _raw(3.0, name="scalar"), _raw([[1, 2]], dtype=np.int64),
    _raw([True, False], dtype=np.bool_), _raw([1.5], dtype=np.float16), _raw([1, 2], dtype=np.uint64),
    helper.make_tensor("f", TensorProto.FLOAT, [2], [1.0, 2.0]),
    helper.make_tensor("h", TensorProto.FLOAT16, [2], np.array([1, 2], np.float16)),
    helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"bc"]),
    helper.make_tensor("q", TensorProto.INT4, [5], [1, 2, 3, -1, 0]),
    helper.make_tensor("u2", TensorProto.UINT2, [9], [1] * 9),
    _with(TensorProto(name="qr", data_type=TensorProto.UINT4, raw_data=b"\x21\x03"), dims=[3]),
    helper.make_tensor("c", TensorProto.COMPLEX128, [2], [1 + 1j, 2]),
    helper.make_tensor("u", TensorProto.UINT32, [2], [1, 2]),
    _external(length="8", offset="0"), _external(),
]


@pytest.mark.parametrize("tensor", VALID, ids=lambda t: t.name)
def test_valid_tensors_pass(tensor):
    assert tensor_defect(tensor) is None


def test_no_sample_model_tensor_is_judged_malformed():
    for path in SAMPLE_MODELS:
        proto = onnx.load(str(path), load_external_data=False)
        assert [(owner, tensor_defect(t)) for owner, t, _ in iter_tensors(proto.graph) if tensor_defect(t)] == []


# --------------------------------------------------------------------------- through the commands


def _bias_model(bias: TensorProto, where: str = "initializer") -> onnx.ModelProto:
    """y = x + b, with b an initializer, a Constant node's value, or an initializer of an If branch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if where == "initializer":
        graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"], name="add")], "g", [x], [y], [bias])
    elif where == "constant":
        nodes = [helper.make_node("Constant", [], ["b"], name="bias_const", value=bias),
                 helper.make_node("Add", ["x", "b"], ["y"], name="add")]
        graph = helper.make_graph(nodes, "g", [x], [y])
    else:
        branch = helper.make_graph([helper.make_node("Add", ["x", "b"], ["yb"], name="inner")], "then", [],
                                   [helper.make_tensor_value_info("yb", TensorProto.FLOAT, [1, 4])], [bias])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["ye"], name="same")], "else", [],
                                  [helper.make_tensor_value_info("ye", TensorProto.FLOAT, [1, 4])])
        nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
                 helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
                 helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=branch, else_branch=other)]
        graph = helper.make_graph(nodes, "g", [x], [y], [_raw(0.0, name="zero")])
    return make(graph, check=False)


def _grown(tensor: TensorProto) -> TensorProto:
    """The issue's case: three bytes too many, so numpy's frombuffer refused the buffer."""
    tensor.raw_data = tensor.raw_data + b"abc"
    return tensor


@pytest.mark.parametrize("where", ["initializer", "constant", "subgraph"])
def test_every_command_refuses_a_malformed_tensor_in_one_line(tmp_path, where):
    path = tmp_path / "m.onnx"
    onnx.save(_bias_model(_grown(_raw([[1, 2, 3, 4]], name="b")), where), str(path))
    before = path.read_bytes()
    out = tmp_path / "o.onnx"
    for args in (["inspect", path], ["check", path, "--ep", "cpu"], ["convert", path, "--fp16", "-o", out],
                 ["load", path, "--ep", "cpu", "--runs", "1"], ["quantize", path, "--dynamic", "-o", out],
                 ["simplify", path, "-o", out]):
        result = invoke(*args)
        assert result.exit_code == 2, (args[0], result.exit_code, result.stderr)
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1 and "Traceback" not in line, line
        assert "is malformed: raw_data holds 19 bytes, its shape [1, 4] and type float need 16" in line, line
        assert ("initializer 'b'" if where != "constant" else "tensor attribute 'bias_const.value'") in line
        assert "re-export the model" in line
        assert not out.exists()
    record = invoke("check", path, "--ep", "cpu", "--json").json()  # --json still prints one record
    assert record["exit_code"] == 2 and "is malformed" in record["findings"][0]["message"]
    assert path.read_bytes() == before


def test_the_same_model_with_sound_bytes_converts(tmp_path):
    """The control: without the three extra bytes the model is accepted (the gate is not a blanket refusal)."""
    path = tmp_path / "m.onnx"
    onnx.save(_bias_model(_raw([[1, 2, 3, 4]], name="b"), "subgraph"), str(path))
    assert invoke("convert", path, "--fp16", "-o", tmp_path / "o.onnx").exit_code == 0


def _external_model(tmp_path, **entries):
    path = save_external(matmul_weights(), tmp_path / "m.onnx")
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key in entries:
            entry.value = entries[entry.key]
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("entries, message", [
    ({"length": "2044"}, "external-data length is 2044 bytes, its shape [32, 16] and type float need 2048"),
    ({"offset": "x"}, "external-data offset 'x' is not a byte count"),
    ({"offset": "64"}, "is too short for tensor 'W'"),
])
def test_external_data_entries_against_shape_and_file(tmp_path, entries, message):
    path = _external_model(tmp_path, **entries)
    with pytest.raises(ModelReadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ModelHandle.open(path)
    result = invoke("convert", path, "--fp16", "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_sparse_initializer_values_are_judged(tmp_path):
    values = _grown(_raw([1.0, 2.0], name="sp"))
    sparse = helper.make_sparse_tensor(values, helper.make_tensor("sp_idx", TensorProto.INT64, [2], [0, 3]), [4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              sparse_initializer=[sparse])
    path = tmp_path / "sparse.onnx"
    onnx.save(make(graph, check=False), str(path))
    with pytest.raises(ModelReadError, match="initializer 'sp' is malformed: raw_data holds 11 bytes"):
        ModelHandle.open(path)
