"""Issue 52's rough edges: --help speaks the user's words (no Python type names, no {model}), and
package reads a config that has [targets] and no [[steps]]."""

from __future__ import annotations

import json
import re

import pytest
import typer
from cli_helpers import invoke
from conftest import SAMPLES

from ortprep.cli.app import app

# Typer's own labels: a Python type in angle brackets (<path>, <list[str]>, <int range>, a choice
# list such as <error|warning>) and an argument in braces ({model})
TYPE_LABEL = re.compile(r"<(?:list\[|str>|int|float|path|bool|text|file|dir|choice|[a-z][\w|]*>)")
PLACEHOLDER = re.compile(r"\{[\w.]+\}")


def _commands() -> list[str]:
    return sorted(typer.main.get_command(app).commands)


def test_every_command_is_walked():
    assert {"check", "quantize", "load", "compile", "package", "run", "merge", "hook", "diff"} <= set(_commands())


@pytest.mark.parametrize("name", _commands())
def test_help_shows_user_words_not_python_types(name):
    result = invoke(name, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "Usage:" in text
    assert not TYPE_LABEL.findall(text), f"{name} --help: {TYPE_LABEL.findall(text)}"
    assert not PLACEHOLDER.findall(text), f"{name} --help: {PLACEHOLDER.findall(text)}"


def test_arguments_and_options_are_named_for_what_they_are():
    package = invoke("package", "--help", env={"COLUMNS": "200"}).stdout
    assert " package [OPTIONS] MODEL\n" in package
    assert re.search(r"--target EP\b", package) and re.search(r"--name NAME\b", package)
    assert re.search(r"-o, --output DIR\b", package)
    quantize = invoke("quantize", "--help", env={"COLUMNS": "200"}).stdout
    assert " [OPTIONS] MODEL" in quantize and "--fail-on error|warning|info|never" in quantize
    assert re.search(r"--report FILE\b", quantize)
    assert " [OPTIONS] REPORT..." in invoke("merge", "--help").stdout
    assert re.search(r"-j, --jobs N\b", invoke("run", "--help", env={"COLUMNS": "200"}).stdout)


def test_package_takes_the_targets_of_a_config_without_steps(tmp_path):
    """package reads [targets] alone: a config with neither [[models]] nor [[steps]] is complete for it."""
    config = tmp_path / "ortprep.toml"
    config.write_text('[targets.cpu]\nep = "cpu"\n', encoding="utf-8")
    out = tmp_path / "pkg"
    result = invoke("package", SAMPLES / "cnn.onnx", "--config", config, "-o", out, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert [(v["target"], v["status"]) for v in document["variants"]] == [("cpu", "ok")]
    assert (out / "manifest.json").is_file()


def test_package_config_is_still_validated(tmp_path):
    config = tmp_path / "ortprep.toml"
    config.write_text('[targets.cpu]\nep = "no-such-ep"\n', encoding="utf-8")
    result = invoke("package", SAMPLES / "cnn.onnx", "--config", config, "-o", tmp_path / "pkg")
    assert result.exit_code == 2 and "no-such-ep" in result.stderr and not (tmp_path / "pkg").exists()
