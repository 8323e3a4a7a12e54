"""Every bad-input case: exit 2, at most 4 lines on stderr, no traceback, input unchanged,
no output left behind."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from cli_helpers import invoke
from models import matmul_weights, relu, repoint_external, save_external


def _valid(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save_model(relu(), str(path))
    return path


def _external(tmp_path: Path, location: str | None = None, drop_data: bool = False) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    path = save_external(matmul_weights(), folder / "model.onnx")
    if location:
        (tmp_path / "stolen.data").write_bytes((folder / "model.onnx.data").read_bytes())
        repoint_external(path, location)
    if drop_data:
        (folder / "model.onnx.data").unlink()
    return path


def case_missing(tmp_path):
    return tmp_path / "absent.onnx", "not found"


def case_directory(tmp_path):
    _valid(tmp_path)
    return tmp_path, "is a directory"


def case_empty(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    return path, "is empty"


def case_random_bytes(tmp_path):
    path = tmp_path / "noise.onnx"
    path.write_bytes(os.urandom(4096) + bytes(range(256)) * 8)
    return path, "ONNX model"


def case_truncated(tmp_path):
    whole = tmp_path / "whole.onnx"
    onnx.save_model(matmul_weights(), str(whole))
    path = tmp_path / "truncated.onnx"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    return path, "truncated"


def case_text_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("This is not a model.\nJust some notes about one.\n" * 20)
    return path, "text file"


def case_external_outside(tmp_path):
    return _external(tmp_path, location="../stolen.data"), "outside the model's folder"


def case_external_missing(tmp_path):
    return _external(tmp_path, drop_data=True), "is missing"


CASES = [
    case_missing,
    case_directory,
    case_empty,
    case_random_bytes,
    case_truncated,
    case_text_file,
    case_external_outside,
    case_external_missing,
]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _assert_one_clean_error(result, expected: str) -> None:
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 4, result.stderr
    assert "Traceback" not in result.stderr
    assert expected in result.stderr
    if result.stdout:  # --json: one error document, the failure as a finding
        import json

        document = json.loads(result.stdout)
        assert document["exit_code"] == 2 and expected in document["findings"][0]["message"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.removeprefix("case_"))
@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_bad_model_input(tmp_path, case, as_json):
    model, expected = case(tmp_path)
    before = _snapshot(tmp_path)
    report = tmp_path / "report.json"
    args = ["inspect", model, "--report", report] + (["--json"] if as_json else [])
    result = invoke(*args)
    _assert_one_clean_error(result, expected)
    assert _snapshot(tmp_path) == before  # input bytes unchanged, nothing written


def test_output_in_missing_folder(tmp_path):
    model = _valid(tmp_path)
    before = _snapshot(tmp_path)
    result = invoke("inspect", model, "--report", tmp_path / "missing" / "report.json")
    _assert_one_clean_error(result, "does not exist")
    assert _snapshot(tmp_path) == before


def test_output_equal_to_input(tmp_path):
    model = _valid(tmp_path)
    before = _snapshot(tmp_path)
    result = invoke("inspect", model, "--report", model)
    _assert_one_clean_error(result, "is the input model")
    assert _snapshot(tmp_path) == before


def test_unknown_option_is_exit_2(tmp_path):
    result = invoke("inspect", _valid(tmp_path), "--no-such-option")
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr


def test_debug_env_shows_traceback(tmp_path):
    result = invoke("inspect", tmp_path / "absent.onnx", env={"ORTPREP_DEBUG": "1"})
    assert result.exit_code == 2
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("ortprep: error: model file not found")


# ---------------------------------------------------------------- the error boundary's own mapping


def _boundary_app(exc: BaseException):
    import typer

    from ortprep.cli.boundary import error_boundary

    app = typer.Typer()

    @app.command()
    @error_boundary
    def boom() -> None:
        raise exc

    return app


@pytest.mark.parametrize(
    "exc, code, text",
    [
        (
            __import__("ortprep.errors", fromlist=["UsageError"]).UsageError("bad flag", hint="use --good"),
            2,
            "bad flag; use --good",
        ),
        (
            __import__("ortprep.errors", fromlist=["ModelReadError"]).ModelReadError("cannot read m.onnx"),
            2,
            "cannot read m.onnx",
        ),
        (
            __import__("ortprep.errors", fromlist=["EnvironmentMissingError"]).EnvironmentMissingError("no ORT"),
            3,
            "no ORT",
        ),
        (MemoryError(), 3, "out of memory"),
        (KeyError("x" * 500), 4, "internal error (KeyError"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_error_boundary_maps_exceptions_to_exit_codes(exc, code, text):
    from typer.testing import CliRunner

    result = CliRunner().invoke(_boundary_app(exc), [])
    assert result.exit_code == code
    assert text in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    debug = CliRunner().invoke(_boundary_app(exc), [], env={"ORTPREP_DEBUG": "1"})
    assert debug.exit_code == code
    if code not in (130,):
        assert "Traceback" in debug.stderr


def test_exit_codes_documented():
    from ortprep.errors import ExitCode

    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} |" in doc, code


def test_json_is_printed_even_when_the_command_fails(tmp_path):
    import json

    result = invoke("check", tmp_path / "missing.onnx", "--ep", "cpu", "--json")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["schema"] == "ortprep.error/1" and document["exit_code"] == 2
    assert document["findings"][0]["code"] == "RUN001" and "not found" in document["findings"][0]["message"]
    assert not invoke("check", tmp_path / "missing.onnx", "--ep", "cpu").stdout  # without --json: stderr only


@pytest.mark.parametrize("command", [["convert", "--fp16"], ["quantize", "--dynamic"], ["simplify"]])
def test_metric_of_an_output_the_model_lacks(tmp_path, command):
    # a misspelt --metric output would leave the decision it meant to set inferred, silently
    model = _valid(tmp_path)
    before = _snapshot(tmp_path)
    result = invoke(command[0], model, *command[1:], "--metric", "nosuch=top1", "-o", tmp_path / "out.onnx")
    _assert_one_clean_error(result, "--metric names 'nosuch', not an output of the model")
    assert result.exit_code == 2
    assert _snapshot(tmp_path) == before
