"""Mutated models through the commands: never an internal error (exit 4), never a traceback.
A bounded run here; `make fuzz` runs 2,000 cases through subprocesses (hangs included)."""

from __future__ import annotations

import pytest

from cli_helpers import invoke
from conftest import SAMPLES
from ortprep.fuzz import MUTATIONS, mutate

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


def _run(tmp_path, seed: str, case: int, command: str):
    kind, data = mutate((SAMPLES / seed).read_bytes(), case)
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


@pytest.mark.parametrize("seed, case, command", REGRESSIONS)
def test_regressions(tmp_path, seed, case, command):
    _run(tmp_path, seed, case, command)


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_bounded_fuzz(tmp_path, command):
    kinds = {_run(tmp_path, SEEDS[case % len(SEEDS)], case, command) for case in range(3 * len(MUTATIONS))}
    assert kinds == set(MUTATIONS)  # every mutation was tried
