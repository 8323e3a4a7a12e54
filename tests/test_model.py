from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import ortprep.model as model_module
from models import matmul_weights, relu, repoint_external, save_external, symlink_supported
from ortprep.errors import ModelReadError, OutputPathError, UnsafeExternalDataError
from ortprep.model import ModelHandle, check_output_path, is_external, iter_nodes, iter_tensors


def run(path: Path, feeds: dict) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime", reason="running the saved model needs ONNX Runtime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def external_model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    return save_external(matmul_weights(), folder / "m.onnx")


def test_graph_only_open_reads_no_external_bytes(tmp_path):
    path = external_model(tmp_path)
    handle = ModelHandle.open(path)
    weight = next(t.tensor for t in iter_tensors(handle.graph) if t.owner == "W")
    assert not handle.weights_loaded
    assert is_external(weight) and weight.raw_data == b""
    assert [f.location for f in handle.external_files] == ["m.onnx.data"]
    assert handle.external_files[0].bytes_referenced == 32 * 16 * 4

    handle.load_weights()
    assert handle.weights_loaded
    assert len(weight.raw_data) == 32 * 16 * 4


def test_sha256_of_model_and_data(tmp_path):
    path = external_model(tmp_path)
    handle = ModelHandle.open(path)
    assert handle.sha256() == {"m.onnx": hashlib.sha256(path.read_bytes()).hexdigest()}
    data = path.parent / "m.onnx.data"
    assert handle.sha256(include_data=True)["m.onnx.data"] == hashlib.sha256(data.read_bytes()).hexdigest()


@pytest.mark.parametrize("location", ["../outside.data", "sub/../../outside.data"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    path = external_model(tmp_path)
    (tmp_path / "outside.data").write_bytes((path.parent / "m.onnx.data").read_bytes())
    repoint_external(path, location)
    with pytest.raises(UnsafeExternalDataError, match="outside the model's folder"):
        ModelHandle.open(path)


def test_external_data_absolute_path_is_refused(tmp_path):
    path = external_model(tmp_path)
    repoint_external(path, str(path.parent / "m.onnx.data"))
    with pytest.raises(UnsafeExternalDataError, match="absolute path"):
        ModelHandle.open(path)


def test_external_data_symlink_out_of_folder_is_refused(tmp_path):
    if not symlink_supported(tmp_path):
        pytest.skip("this file system has no symlinks")
    path = external_model(tmp_path)
    outside = tmp_path / "elsewhere.data"
    os.replace(path.parent / "m.onnx.data", outside)
    os.symlink(outside, path.parent / "m.onnx.data")
    with pytest.raises(UnsafeExternalDataError, match="outside the model's folder"):
        ModelHandle.open(path)


def test_missing_and_short_external_data(tmp_path):
    path = external_model(tmp_path)
    data = path.parent / "m.onnx.data"
    content = data.read_bytes()
    data.write_bytes(content[:100])
    with pytest.raises(ModelReadError, match="too short"):
        ModelHandle.open(path)
    data.unlink()
    with pytest.raises(ModelReadError, match="is missing"):
        ModelHandle.open(path)


def test_save_external_model_writes_data_beside_output(tmp_path):
    path = external_model(tmp_path)
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    written = ModelHandle.open(path).save(out_dir / "copy.onnx")
    assert sorted(p.name for p in out_dir.iterdir()) == ["copy.onnx", "copy.onnx.data"]
    assert written == out_dir / "copy.onnx"
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_array_equal(run(written, {"x": x})[0], run(path, {"x": x})[0])
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before  # input untouched
    assert (os.stat(written).st_mode & 0o777) == (0o666 & ~_umask())


def test_save_external_model_again_from_the_output_folder(tmp_path, monkeypatch):
    """onnx refuses an external-data location that exists relative to the working directory: a
    --force rerun from the output's own folder died there (exit 4) on the first run's .data file."""
    path = external_model(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.chdir(out_dir)
    first = ModelHandle.open(path).save(out_dir / "copy.onnx")
    data = (out_dir / "copy.onnx.data").read_bytes()
    again = ModelHandle.open(path).save(out_dir / "copy.onnx", force=True)
    assert again == first and (out_dir / "copy.onnx.data").read_bytes() == data
    assert sorted(p.name for p in out_dir.iterdir()) == ["copy.onnx", "copy.onnx.data"]
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_array_equal(run(again, {"x": x})[0], run(path, {"x": x})[0])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_save_inline_model_keeps_it_inline(tmp_path):
    source = tmp_path / "relu.onnx"
    onnx.save_model(relu(), str(source))
    out = ModelHandle.open(source).save(tmp_path / "relu.out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relu.onnx", "relu.out.onnx"]
    assert onnx.load(str(out)) == onnx.load(str(source))


def test_save_switches_to_external_data_above_threshold(tmp_path, monkeypatch):
    source = tmp_path / "m.onnx"
    onnx.save_model(matmul_weights(), str(source))
    monkeypatch.setattr(model_module, "AUTO_EXTERNAL_THRESHOLD", 256)
    out = ModelHandle.open(source).save(tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size == 32 * 16 * 4
    assert ModelHandle.open(out).external_files[0].location == "big.onnx.data"


def test_save_refuses_input_unless_forced(tmp_path):
    path = external_model(tmp_path)
    original = path.read_bytes()
    handle = ModelHandle.open(path)
    with pytest.raises(OutputPathError, match="is the input model"):
        handle.save(path)
    assert path.read_bytes() == original
    handle.save(path, force=True)
    reopened = ModelHandle.open(path, load_weights=True)
    assert reopened.external_files[0].location == "m.onnx.data"
    x = np.ones((2, 32), dtype=np.float32)
    assert run(path, {"x": x})[0].shape == (2, 16)
    assert not [p for p in path.parent.iterdir() if "ortprep-tmp" in p.name]


def test_save_into_missing_folder_fails_before_writing(tmp_path):
    source = tmp_path / "relu.onnx"
    onnx.save_model(relu(), str(source))
    with pytest.raises(OutputPathError, match="does not exist"):
        ModelHandle.open(source).save(tmp_path / "nope" / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relu.onnx"]


def test_check_output_path_rejects_directory(tmp_path):
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output_path(tmp_path)


def test_iter_nodes_reaches_subgraphs(samples):
    handle = ModelHandle.open(samples / "control_flow.onnx")
    scoped = [(scope, node.name) for scope, node in iter_nodes(handle.graph)]
    assert ("", "choose") in scoped
    assert ("/choose.then_branch", "then_add") in scoped
    assert ("/repeat.body", "body_add") in scoped


def sparse_matmul(folder: Path, rows: int, cols: int) -> Path:
    """x @ w with w (rows x cols float32) in an external file that is sparse: any size, no disk."""
    from onnx import TensorProto, helper

    folder.mkdir()
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[rows, cols])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(rows * cols * 4))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])], [weight])
    model = folder / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    with open(folder / "w.bin", "wb") as data:
        data.truncate(rows * cols * 4)
    return model


def test_streamed_fp16_is_refused_when_the_disk_cannot_hold_it(tmp_path):
    """convert --fp16 streams weights beyond memory (no memory limit), but refuses up front an
    output the disk cannot hold: here 1 TiB of (sparse) float32 weights, 512 GiB to write."""
    from cli_helpers import invoke

    model = sparse_matmul(tmp_path / "m", rows=1 << 20, cols=1 << 18)
    result = invoke("convert", model, "--fp16", "-o", tmp_path / "o.onnx")
    assert result.exit_code == 3, result.stderr
    assert "would write 512.0 GiB of weights" in result.stderr and "GiB free" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # nothing staged, nothing written


def test_weights_beyond_memory_are_refused_with_the_numbers(tmp_path):
    """A model whose external weights (here a sparse 200 GiB file) cannot fit: the steps that load
    weights stop before any work with exit 3; inspect and check, which read no weights, still work."""
    from cli_helpers import invoke

    model = sparse_matmul(tmp_path / "m", rows=1 << 18, cols=1 << 16)
    for args in (["convert", model, "--opset", "18", "-o", tmp_path / "o.onnx"], ["load", model, "--ep", "cpu"]):
        result = invoke(*args)
        assert result.exit_code == 3, result.stderr
        assert "GiB of tensors in memory" in result.stderr and "GiB available" in result.stderr
        assert not (tmp_path / "o.onnx").exists()
    assert invoke("inspect", model).exit_code in (0, 1)
    assert invoke("check", model, "--ep", "cpu").exit_code in (0, 1)
