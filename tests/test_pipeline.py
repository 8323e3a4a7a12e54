"""ortprep run: the pipeline file a model repository's CI runs."""

from __future__ import annotations

import shutil
import textwrap
from xml.etree import ElementTree

import pytest

from cli_helpers import invoke
from conftest import SAMPLES


def repo(tmp_path, config: str, model: str = "conv1d_audio.onnx"):
    shutil.copy(SAMPLES / model, tmp_path / model)
    path = tmp_path / "ortprep.toml"
    path.write_text(textwrap.dedent(config))
    return path


NPU_READY = """
    model = "conv1d_audio.onnx"

    [[steps]]
    run = "check"
    eps = ["dml-npu"]
    fail_on = "never"

    [[steps]]
    name = "make it NPU-ready"
    run = "convert"
    fp16 = true
    ep = "dml-npu"
    fix_dims = { batch = 1 }
    conv1d_to_conv2d = true

    [[steps]]
    run = "check"
    eps = ["dml-npu"]

    [[steps]]
    run = "load"
    eps = ["cpu"]
"""


def test_pipeline_passes_and_chains_models(tmp_path):
    config = repo(tmp_path, NPU_READY)
    result = invoke("run", config, "--json", "--junit", tmp_path / "junit.xml", "--markdown", tmp_path / "summary.md")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["schema"] == "ortprep.run/2" and record["passed"] is True
    assert [s["status"] for s in record["steps"]] == ["passed"] * 4
    converted = tmp_path / "build" / "conv1d_audio.2-convert.onnx"
    assert record["final_model"] == str(converted) and converted.exists()
    assert record["steps"][2]["model"] == str(converted)  # the second check ran on the converted model
    assert record["steps"][0]["report"]["results"][0]["verdict"] != "full"
    assert record["steps"][2]["report"]["results"][0]["verdict"] == "full"
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    assert "## ortprep: passed" in (tmp_path / "summary.md").read_text()


def test_failing_gate_stops_the_run(tmp_path):
    config = repo(tmp_path, """
        model = "cnn.onnx"

        [[steps]]
        run = "check"
        eps = ["dml-npu"]

        [[steps]]
        run = "convert"
        fp16 = true
        ep = "dml-npu"
    """, model="cnn.onnx")
    result = invoke("run", config, "--junit", tmp_path / "junit.xml", "--markdown", tmp_path / "summary.md")
    assert result.exit_code == 1
    assert "failed" in result.stdout and "NPU001" in result.stdout
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == "1" and suite.get("skipped") == "1"
    failure = suite.find("testcase/failure")
    assert failure is not None and "NPU001" in failure.text
    summary = (tmp_path / "summary.md").read_text()
    assert "## ortprep: failed" in summary and "| 2. convert | skipped |" in summary
    assert not (tmp_path / "build" / "cnn.2-convert.onnx").exists()


@pytest.mark.parametrize(
    "config, message",
    [
        (
            'model = "cnn.onnx"\ncolour = "blue"\n[[steps]]\nrun = "check"\neps = ["dml"]\n',
            "unknown top-level key(s) colour",
        ),
        ('model = "cnn.onnx"\n[[steps]]\nrun = "compress"\n', "unknown step 'compress'"),
        ('model = "cnn.onnx"\n[[steps]]\nrun = "convert"\nfp17 = true\n', "unknown option(s) fp17"),
        ('model = "cnn.onnx"\n[[steps]]\nrun = "check"\neps = ["gpu9000"]\n', "unknown execution provider 'gpu9000'"),
        ('model = "cnn.onnx"\n[[steps]]\nrun = "check"\n', "no EP given"),
        (
            'model = "cnn.onnx"\nfail_on = "sometimes"\n[[steps]]\nrun = "check"\neps = ["dml"]\n',
            "fail_on is 'sometimes'",
        ),
        ('model = "cnn.onnx"\n', "no steps"),
        ('model = "missing.onnx"\n[[steps]]\nrun = "check"\neps = ["dml"]\n', "model file not found"),
        ('model = "cnn.onnx"\n[[steps]\n', "not valid TOML"),
        # a repository's keys misspelled: the message names the spelling that works
        ('[[target]]\nep = "cpu"\n', "a repository config has targets (spelled so)"),
        ('[[models]]\npath = "*.onnx"\n[[targets]]\nep = "cpu"\n', "write each target as [targets.NAME]"),
    ],
)
def test_bad_config_exit_2(tmp_path, config, message):
    path = repo(tmp_path, config, model="cnn.onnx")
    result = invoke("run", path)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "build").exists()


def test_missing_config(tmp_path):
    result = invoke("run", tmp_path / "ortprep.toml")
    assert result.exit_code == 2 and "config not found" in result.stderr and "ortprep init" in result.stderr
