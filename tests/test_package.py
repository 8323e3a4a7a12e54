"""ortprep package and load --package: variants per target in ORT's model package layout, each
made by ortprep's own verified steps, read back by the installed ORT, and the variant ORT picks
for each EP here proven by a real session."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import invoke
from conftest import SAMPLES

from ortprep.runtime.providers import probe_runtime

HAVE_QNN = probe_runtime().runs("qnn")
HAVE_CUDA = probe_runtime().runs("cuda")  # a GPU machine: the CUDA variant is then proven by a session
needs_qnn = pytest.mark.skipif(not HAVE_QNN, reason="onnxruntime-qnn is not installed (make install adds it)")


def _data(folder: Path) -> tuple[Path, Path]:
    """24 calibration samples and one verification input for the sample CNN (1x3x32x32)."""
    rng = np.random.default_rng(7)
    calib = folder / "calib"
    calib.mkdir()
    for index in range(24):
        np.savez(calib / f"s{index}.npz", image=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    inputs = folder / "inputs.npz"
    np.savez(inputs, image=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    return calib, inputs


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("package")
    calib, inputs = _data(folder)
    targets = ["--target", "cpu", "--target", "cuda"] + (["--target", "qnn"] if HAVE_QNN else [])
    result = invoke("package", SAMPLES / "cnn.onnx", "-o", folder / "pkg", *targets, "--calib", calib,
                    "--inputs", inputs, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    return folder / "pkg", result.json()


def _variants(pkg: Path) -> dict:
    return json.loads((pkg / "model" / "component.json").read_text())["variants"]


def test_package_writes_one_variant_per_target_with_its_proofs(package):
    pkg, record = package
    assert record["schema"] == "ortprep.package/1" and record["written"] is True
    variants = _variants(pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["schema_version"] == "1.0" and manifest["components"] == {"model": "model"}
    assert manifest["additional_metadata"]["ortprep"]["reference_variant"] == "cpu"
    # cpu: the source model itself, proven on the CPU EP against itself
    cpu = variants["cpu"]
    assert cpu["ep"] == "CPUExecutionProvider" and cpu["device"] == "cpu"
    assert (pkg / "model/cpu/model.onnx").read_bytes() == (SAMPLES / "cnn.onnx").read_bytes()
    assert cpu["additional_metadata"]["ortprep"]["proofs"]["load"]["status"] == "ok"
    # cuda: FP16, verified by convert; CUDA does not run here, which the proofs and PKG002 say
    cuda = variants["cuda"]
    assert cuda["ep"] == "CUDAExecutionProvider" and cuda["device"] == "gpu"
    weights = onnx.load(str(pkg / "model/cuda/model.onnx")).graph.initializer
    assert {w.data_type for w in weights if w.data_type in (1, 10)} == {onnx.TensorProto.FLOAT16}
    proofs = cuda["additional_metadata"]["ortprep"]["proofs"]
    assert proofs["accuracy"]["step"] == "convert" and proofs["accuracy"]["cosine"] > 0.999
    assert proofs["accuracy"]["decisions"] == [{"output": "logits", "kind": "top1", "agreement": 1.0, "passed": True}]
    assert proofs["placement"]["verdict"] == "full"
    if HAVE_CUDA:
        assert proofs["load"]["status"] == "ok" and proofs["load"]["nodes_on_ep"] == proofs["load"]["nodes_total"]
    else:
        assert proofs["load"]["status"] == "not run"
        assert any(f["code"] == "PKG002" and "cuda" in f["message"] for f in record["findings"])
    # the installed ORT reads the package back with its own strict reader
    if record["ort_model_package"]["read_by"]:
        assert set(record["ort_model_package"]["components"]["model"]) == set(variants)
    # nothing left behind beside it
    assert sorted(p.name for p in pkg.parent.iterdir() if p.name.startswith(".")) == []


@needs_qnn
def test_qnn_target_holds_the_compiled_model_first_and_its_qdq_source(package):
    pkg, _record = package
    variants = _variants(pkg)
    assert list(variants) == ["cpu", "cuda", "qnn", "qnn-qdq"]  # ORT prefers the first that fits
    compiled, qdq = variants["qnn"], variants["qnn-qdq"]
    assert compiled["compatibility_string"].split(":")[5] == "60"  # the stated default device, X Elite
    model = onnx.load(str(pkg / "model/qnn/model.onnx"))
    assert any(node.op_type == "EPContext" for node in model.graph.node)
    assert "compatibility_string" not in qdq
    assert any(node.op_type == "QuantizeLinear" for node in onnx.load(str(pkg / "model/qnn-qdq/model.onnx")).graph.node)
    assert qdq["executor_info"]["ort"]["provider_options"] == {"soc_model": "60"}
    proofs = compiled["additional_metadata"]["ortprep"]["proofs"]
    assert proofs["compile"]["compatibility"]["QNNExecutionProvider"] == compiled["compatibility_string"]
    # compile --eval
    assert proofs["compile"]["samples"]["samples"] == 24 and proofs["compile"]["samples"]["failed"] == 0
    assert proofs["load"]["vs_source"][0]["cosine"] > 0.999
    assert qdq["additional_metadata"]["ortprep"]["proofs"]["accuracy"]["step"] == "quantize"


@needs_qnn
def test_load_package_runs_the_variant_ort_picks_for_each_ep_here(package):
    pkg, _record = package
    result = invoke("load", "--package", pkg, "--json")
    assert result.exit_code == 0, result.stdout
    rows = {row["ep"]: row for row in result.json()["results"]}
    assert set(rows) == {"cpu", "qnn"}  # CUDA does not run here: its variant is not tried
    assert rows["cpu"]["variant"] == "cpu" and rows["cpu"]["status"] == "passed"
    assert rows["qnn"]["variant"] == "qnn" and rows["qnn"]["file"] == "model/qnn/model.onnx"
    assert rows["qnn"]["selected_by"] in ("onnxruntime", "ortprep")
    load = rows["qnn"]["load"]
    assert load["status"] in ("ok", "fallback") and load["nodes_on_ep"] >= 1
    assert load["three_way"]["total"]["cosine"] > 0.999  # the compiled model against the float variant


def test_load_package_on_an_ep_with_no_variant_fails(tmp_path):
    calib, inputs = _data(tmp_path)
    made = invoke(
        "package", SAMPLES / "cnn.onnx", "-o", tmp_path / "gpu-only", "--target", "cuda", "--inputs", inputs, "--json"
    )
    assert made.exit_code == 0, made.stdout
    result = invoke("load", "--package", tmp_path / "gpu-only", "--ep", "cpu", "--ep", "cuda", "--json")
    assert result.exit_code == 1
    record = result.json()
    codes = {f["code"]: f["message"] for f in record["findings"]}
    assert "no variant of gpu-only fits cpu" in codes["PKG005"]
    if HAVE_CUDA:
        assert next(row for row in record["results"] if row["ep"] == "cuda")["variant"] == "cuda"
    else:
        assert "cuda does not run here" in codes["PKG004"]
        # nothing to try here at all: one line, exit 3 (an EP asked for is missing, as load says)
        nothing = invoke("load", "--package", tmp_path / "gpu-only")
        assert nothing.exit_code == 3 and "no EP a variant of gpu-only is for runs here" in nothing.stderr
        asked = invoke("load", "--package", tmp_path / "gpu-only", "--ep", "cuda", "--json")
        assert asked.exit_code == 3 and [f["code"] for f in asked.json()["findings"]] == ["PKG004"]


def test_a_target_that_fails_its_gate_writes_nothing(tmp_path):
    calib, inputs = _data(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "pkg", "--target", "cpu", "--target", "qnn",
                    "--calib", calib, "--inputs", inputs, "--min-cosine", "1.0", "--json")
    assert result.exit_code == 1
    record = result.json()
    assert record["written"] is False and record["package"] is None
    refusal = next(f for f in record["findings"] if f["code"] == "PKG001")
    assert "target qnn: quantize --static failed" in refusal["message"] and "not written" in refusal["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no package, no staging folder


@needs_qnn
def test_device_goes_to_the_targets_that_have_devices(tmp_path):
    """--device names QNN's SoC: the cpu target does not take it, the QNN variant carries it in its
    provider options (the application's session gets the same), and a refusal removes the
    folders it made for -o."""
    calib, inputs = _data(tmp_path)
    result = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "pkg", "--target", "cpu", "--target", "qnn",
                    "--calib", calib, "--inputs", inputs, "--device", "8gen3", "--no-compile", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    qnn = _variants(tmp_path / "pkg")["qnn"]
    from ortprep.eps.devices import resolve_device

    assert qnn["executor_info"]["ort"]["provider_options"] == resolve_device("qnn", "8gen3").provider_options
    refused = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "a" / "b" / "pkg", "--target", "qnn",
                     "--calib", calib, "--min-cosine", "1.0", "--no-compile")
    assert refused.exit_code == 1 and not (tmp_path / "a").exists()


def test_external_data_is_copied_and_digested(tmp_path):
    made = invoke(
        "package", SAMPLES / "external_data" / "mlp.onnx", "-o", tmp_path / "pkg", "--target", "cpu", "--json"
    )
    assert made.exit_code == 0, made.stdout
    cpu = _variants(tmp_path / "pkg")["cpu"]["additional_metadata"]["ortprep"]
    assert set(cpu["files"]) == {"model.onnx", "mlp.onnx.data"}  # the source's files, byte for byte
    assert (tmp_path / "pkg/model/cpu/mlp.onnx.data").read_bytes() == (
        SAMPLES / "external_data/mlp.onnx.data"
    ).read_bytes()
    loaded = invoke("load", "--package", tmp_path / "pkg", "--json")
    assert loaded.exit_code == 0 and loaded.json()["results"][0]["status"] == "passed"


def test_package_refusals_are_one_line_usage_errors(tmp_path):
    calib, inputs = _data(tmp_path)
    no_calib = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "p", "--target", "qnn")
    assert (
        no_calib.exit_code == 2 and "needs calibration data" in no_calib.stderr and "Traceback" not in no_calib.stderr
    )
    (tmp_path / "taken").mkdir()
    taken = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "taken", "--target", "cpu")
    assert taken.exit_code == 2 and "exists" in taken.stderr
    forced = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "taken", "--target", "cpu", "--force")
    assert forced.exit_code == 2 and "not a package" in forced.stderr
    not_package = invoke("load", "--package", tmp_path / "taken")
    assert not_package.exit_code == 2 and "not a model package" in not_package.stderr
    assert not (tmp_path / "p").exists()
    clash = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "p", "--target", "qnn-qdq=cpu", "--target", "qnn",
                   "--calib", calib)
    assert clash.exit_code == 2 and "share the folder qnn-qdq" in clash.stderr
    late = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "p", "--target", "cpu", "--target", "qnn")
    assert late.exit_code == 2 and "needs calibration data" in late.stderr  # before any variant is made
    assert not (tmp_path / "p").exists()


@needs_qnn
def test_no_compile_ships_the_qdq_model_and_says_so(tmp_path):
    calib, inputs = _data(tmp_path)
    result = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "pkg", "--target", "npu=qnn", "--calib", calib,
                    "--inputs", inputs, "--no-compile", "--json")
    assert result.exit_code == 0, result.stdout
    assert list(_variants(tmp_path / "pkg")) == ["npu"]
    finding = next(f for f in result.json()["findings"] if f["code"] == "PKG003")
    assert "--no-compile" in finding["message"]


OPENVINO_PYTHON = Path(__file__).resolve().parents[1] / ".venv-openvino" / "bin" / "python"


@pytest.mark.skipif(
    not OPENVINO_PYTHON.exists(), reason="the OpenVINO environment is not built (make install builds it)"
)
def test_a_target_in_another_environment_is_proven_and_picked_there(tmp_path):
    """OpenVINO lives in its own ORT build: package proves its variant there (--runtime), and
    load --package picks it with ORT's rules applied by ortprep (that build has no package API)."""
    runtime = f"openvino-cpu={OPENVINO_PYTHON}"
    made = invoke(
        "package",
        SAMPLES / "cnn.onnx",
        "-o",
        tmp_path / "pkg",
        "--target",
        "cpu",
        "--target",
        "openvino-cpu",
        "--runtime",
        runtime,
        "--json",
    )
    assert made.exit_code == 0, made.stdout
    proofs = {v["name"]: v["proofs"] for v in made.json()["variants"]}
    assert proofs["openvino-cpu"]["load"]["status"] == "ok" and proofs["openvino-cpu"]["load"]["nodes_on_ep"] > 0
    loaded = invoke("load", "--package", tmp_path / "pkg", "--ep", "openvino-cpu", "--runtime", runtime, "--json")
    assert loaded.exit_code == 0, loaded.stdout
    row = loaded.json()["results"][0]
    assert row["variant"] == "openvino-cpu" and row["status"] == "passed"
    assert row["selected_by"] in ("ortprep", "onnxruntime")


@needs_qnn
def test_ortprep_applies_orts_selection_rules_where_ort_cannot_be_asked(package):
    """ORT's own selection died now and then in the QNN plugin (SIGSEGV, 1.32.0 with
    onnxruntime-qnn 2.7.0); load --package then applies ORT's rules itself. The same answer: the
    compiled variant first, whose compatibility the simulator's CPU device cannot judge (ORT
    scores that as not applicable, not as a rejection)."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.requests.package import SelectVariant
    from ortprep.runtime.targets import ep_runtime, session_options
    from ortprep.runtime.worker import call, workers_scope

    pkg, _record = package
    target = ep_runtime(resolve_ep("qnn"))
    request = SelectVariant(package=str(pkg), component="model", provider="QNNExecutionProvider",
                            plugin_library=target.plugin["library"], provider_options=session_options(target),
                            variants=_variants(pkg), ask_ort=False)
    with workers_scope():
        reply = call(request, timeout=120)
    assert reply.ok and reply.variant == "qnn" and reply.selected_by == "ortprep"
    assert "could not judge its compiled model" in reply.why
