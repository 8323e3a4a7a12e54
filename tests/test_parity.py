"""One path: every command is a one-step pipeline. The command line, the config it writes out
(--emit-config) and `ortprep run` on that config give the same JSON, exit code and files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest

from cli_helpers import invoke
from conftest import SAMPLES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Measured times differ from run to run; everything else must be equal.
VOLATILE = {"latency_ms", "float_latency_ms", "quant_latency_ms", "latency_ratio", "profile",
            "seconds", "engine_seconds", "peak_rss",  # quantize engines: their time and memory
            "timing"}  # quantize's ledger of where the step's time went


# Findings that a timing decides (QNT004: slower than float on this CPU), present in one run and not
# in the next on a loaded machine: left out of the comparison as the figures themselves are.
TIMED_FINDINGS = {"QNT004"}


def normalized(record):
    if isinstance(record, dict) and isinstance(record.get("findings"), list):
        record = {**record, "findings": [f for f in record["findings"]
                                         if not (isinstance(f, dict) and f.get("code") in TIMED_FINDINGS)]}
    if isinstance(record, str):
        return re.sub(r"\d+\.\d+ ms", "<ms>", record)
    if isinstance(record, dict):
        return {k: (None if k in VOLATILE else normalized(v)) for k, v in record.items()}
    if isinstance(record, list):
        return [normalized(v) for v in record]
    return record


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def calib_folder(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(10):
        np.savez(folder / f"s{index}.npz", image=rng.random((1, 3, 32, 32), dtype=np.float32))
    return folder


# (model, command line after the model, the file it writes or None)
CASES = {
    "inspect": ("cnn.onnx", ["inspect"], None),
    "check": ("cnn.onnx", ["check", "--ep", "dml-npu", "--ep", "openvino-cpu,dml"], None),
    "convert": (
        "conv1d_audio.onnx",
        ["convert", "--fp16", "--ep", "directml", "--fix-dim", "batch=1", "--conv1d-to-conv2d", "-o", "{tmp}/out.onnx"],
        "out.onnx",
    ),
    "simplify": (
        "cnn.onnx",
        ["simplify", "--skip-pass", "eliminate_nop_transpose", "-o", "{tmp}/out.onnx"],
        "out.onnx",
    ),
    "optimize": ("transformer_block.onnx", ["optimize", "--level", "basic", "-o", "{tmp}/out.onnx"], "out.onnx"),
    "quantize": (
        "cnn.onnx",
        ["quantize", "--static", "--calib", "{tmp}/calib", "--ep", "trt", "--per-tensor", "-o", "{tmp}/out.onnx"],
        "out.onnx",
    ),
    "load": (
        "cnn.onnx",
        ["load", "--ep", "cpu", "--runs", "2", "--provider-option", "cpu:intra_op_num_threads=1"],
        None,
    ),
    "doctor": (None, ["doctor", "--scan", "{tmp}/code"], None),
    "compile": ("cnn.onnx", ["compile", "--ep", "qnn", "-o", "{tmp}/out.onnx"], "out.onnx"),
}
# The EP's compiled context is not byte-stable from one compile to the next.
SAME_FILES_EXCEPT = {"compile"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_command_line_and_config_agree(tmp_path, name):
    if name == "compile" and importlib.util.find_spec("onnxruntime_qnn") is None:
        pytest.skip("compile needs an EP that compiles: onnxruntime-qnn is not installed")
    model_name, args, written = CASES[name]
    calib_folder(tmp_path / "calib")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "app.py").write_text("import onnxruntime as ort\nsession = ort.InferenceSession('m.onnx')\n")
    model = None
    if model_name:
        model = tmp_path / model_name
        shutil.copy(SAMPLES / model_name, model)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    argv = argv[:1] + ([str(model)] if model else []) + argv[1:]
    before = digest(model) if model else None

    direct = invoke(*argv, "--json")
    assert direct.exit_code in (0, 1), direct.stderr
    output = tmp_path / written if written else None
    direct_output = digest(output) if output else None
    if output:
        output.unlink()

    config = tmp_path / "ortprep.toml"
    emitted = invoke(*argv, "--emit-config", config)
    assert emitted.exit_code == 0 and emitted.stdout == "", emitted.stderr
    assert output is None or not output.exists()  # --emit-config writes the config and nothing else
    tomllib.loads(config.read_text())
    via_config = invoke("run", config, "--json")

    assert via_config.exit_code == direct.exit_code
    run = via_config.json()
    assert run["schema"] == "ortprep.run/2" and len(run["steps"]) == 1
    assert normalized(run["steps"][0]["report"]) == normalized(direct.json())
    if output:
        assert output.exists()
        if name not in SAME_FILES_EXCEPT:
            assert digest(output) == direct_output
    if model:
        assert digest(model) == before


def test_emitted_config_uses_the_config_keys(tmp_path):
    config = tmp_path / "c.toml"
    result = invoke("convert", SAMPLES / "conv1d_audio.onnx", "--fp16", "--ep", "directml", "--fix-dim", "batch=1",
                    "--block-op", "Resize", "--fp16-io", "-o", tmp_path / "o.onnx", "--fail-on", "warning",
                    "--emit-config", config)
    assert result.exit_code == 0
    document = tomllib.loads(config.read_text())
    step = document["steps"][0]
    assert step == {"run": "convert", "fail_on": "warning", "output": "o.onnx", "fp16": True, "ep": "dml",
                    "keep_io_types": False, "block_ops": ["Resize"], "fix_dims": {"batch": 1}}
    assert Path(config.parent / document["model"]).resolve() == (SAMPLES / "conv1d_audio.onnx").resolve()


def test_config_keys_work_as_flags(tmp_path):
    """Every config key is also a flag (the field name in kebab case)."""
    by_key = invoke("convert", SAMPLES / "conv1d_audio.onnx", "--fp16", "--fix-dims", "batch=1", "--block-ops", "Relu",
                    "-o", tmp_path / "a.onnx", "--json")
    by_flag = invoke("convert", SAMPLES / "conv1d_audio.onnx", "--fp16", "--fix-dim", "batch=1", "--block-op", "Relu",
                     "-o", tmp_path / "b.onnx", "--json")
    assert by_key.exit_code == by_flag.exit_code == 0
    assert by_key.json()["kept_fp32_nodes"] == by_flag.json()["kept_fp32_nodes"]


# ---------------------------------------------------------------- the divergences of the old split


def pipeline(tmp_path, body: str, model: str = "cnn.onnx") -> Path:
    shutil.copy(SAMPLES / model, tmp_path / model)
    path = tmp_path / "ortprep.toml"
    path.write_text(textwrap.dedent(body))
    return path


def test_directml_alias_in_a_config_runs_like_the_command_line(tmp_path):
    """Was exit 4 (FileNotFoundError on eps/data/directml.json) in a config, fine on the CLI."""
    config = pipeline(tmp_path, """
        model = "cnn.onnx"
        [[steps]]
        run = "convert"
        fp16 = true
        ep = "directml"
    """)
    result = invoke("run", config, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["steps"][0]["report"]["transforms"][-1]["detail"] == "ep dml"


@pytest.mark.parametrize("body, message", [
    # Was accepted in a config and refused on the command line.
    ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp16 = true\nfix_dims = { batch = 0 }\n',
     "fix_dims.batch = 0 is not a positive integer"),
    # Was caught only after step 1 had written its model: an EP without a quantization preset ...
    ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp16 = true\n[[steps]]\nrun = "quantize"\nmode = "dynamic"\n'
     'ep = "coreml"\n', "no quantization preset for 'coreml'"),
    # ... and an unknown EP in a later step.
    ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp16 = true\n[[steps]]\nrun = "quantize"\nmode = "dynamic"\n'
     'ep = "gpu9000"\n', "unknown execution provider 'gpu9000'"),
    ('model = "cnn.onnx"\n[[steps]]\nrun = "quantize"\nmode = "sometimes"\n', "mode = 'sometimes' is not valid"),
    ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp16 = "yes"\n', "fp16 = 'yes' is not true or false"),
    ('model = "cnn.onnx"\n[[steps]]\nrun = "check"\neps = ["dml"]\noutput = "x.onnx"\n', "'output' is only for steps"),
    ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp16 = true\nforce = true\n', "unknown option(s) force"),
    ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp16 = true\noutput = "cnn.onnx"\n', "is the input model"),
])
def test_bad_values_exit_2_before_anything_is_written(tmp_path, body, message):
    config = pipeline(tmp_path, body)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke("run", config)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_trt_alias_is_tensorrt_everywhere(tmp_path):
    config = pipeline(tmp_path, """
        model = "cnn.onnx"
        [[steps]]
        run = "quantize"
        mode = "dynamic"
        ep = "trt"
        calib = "random"
        metrics = { logits = "cosine" }
        fail_on = "never"
    """)
    result = invoke("run", config, "--json")
    report = result.json()["steps"][0]["report"]
    assert report["preset"]["ep"] == "tensorrt"
    # the small sample does not shrink (QNT003): too few weights for int8 to pay, so said and written
    assert result.exit_code == 0, result.stdout
    assert [f["severity"] for f in report["findings"] if f["code"] == "QNT003"] == ["warning"]


# ---------------------------------------------------------------- one report, every renderer


def findings_in(document) -> list[str]:
    """Every finding object anywhere in a JSON document, serialized."""
    found = []
    if isinstance(document, dict):
        if {"code", "severity", "message"} <= set(document):
            found.append(json.dumps(document, sort_keys=True))
        for value in document.values():
            found += findings_in(value)
    elif isinstance(document, list):
        for value in document:
            found += findings_in(value)
    return found


@pytest.mark.parametrize("args", [
    ["check", SAMPLES / "transformer_block.onnx", "--ep", "dml", "--ep", "xnnpack", "--ep", "openvino-cpu,dml"],
    ["inspect", SAMPLES / "custom_op.onnx"],
    ["load", SAMPLES / "cnn.onnx", "--ep", "cpu", "--ep", "cuda", "--runs", "1"],
])
def test_every_finding_appears_once(args):
    document = invoke(*args, "--json").json()
    found = findings_in(document)
    assert found, "the case must have findings to be meaningful"
    assert len(found) == len(set(found))
    assert len(found) == len(document["findings"])


def test_every_finding_appears_once_in_a_run(tmp_path):
    config = pipeline(tmp_path, """
        model = "cnn.onnx"
        [[steps]]
        run = "check"
        eps = ["dml-npu", "qnn"]
        fail_on = "never"
        [[steps]]
        run = "inspect"
    """)
    document = invoke("run", config, "--json").json()
    found = findings_in(document)
    expected = sum(len(step["report"]["findings"]) for step in document["steps"])
    assert len(found) == expected > 0 and len(set(found)) == len(found)


@pytest.mark.parametrize("args, failures", [
    (["check", SAMPLES / "cnn.onnx", "--ep", "dml-npu"], 1),
    (["inspect", SAMPLES / "cnn.onnx"], 0),
    (["doctor"], None),
])
def test_junit_and_markdown_for_every_command(tmp_path, args, failures):
    result = invoke(*args, "--junit", tmp_path / "j.xml", "--markdown", tmp_path / "s.md")
    suite = ElementTree.parse(tmp_path / "j.xml").getroot()
    assert suite.get("tests") == "1"
    case = suite.find("testcase")
    assert case is not None and case.get("classname") == f"ortprep.{args[0]}"
    summary = (tmp_path / "s.md").read_text()
    if failures is not None:
        assert suite.get("failures") == str(failures) and result.exit_code == failures
        assert ("## ortprep: failed" if failures else "## ortprep: passed") in summary
    if failures:
        assert "NPU001" in case.find("failure").text and "NPU001" in summary


def test_report_file_is_the_json_document(tmp_path):
    result = invoke("check", SAMPLES / "cnn.onnx", "--ep", "dml", "--json", "--report", tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == result.json()


def test_options_doc_is_generated_from_the_definitions():
    import subprocess

    root = Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [sys.executable, str(root / "tools" / "gen_options_doc.py"), "--check"], capture_output=True, text=True
    )
    assert child.returncode == 0, child.stderr
    text = (root / "docs" / "options.md").read_text()
    assert "| `fix_dims` | `--fix-dim`, `--fix-dims` |" in text and "`--static`" in text


def test_every_option_field_has_help():
    from ortprep.options import spec_of
    from ortprep.steps import REGISTRY, options_class

    for name in REGISTRY:
        for field in options_class(name).fields():
            assert spec_of(field).help.strip().endswith((".", ")")), (name, field.name)
