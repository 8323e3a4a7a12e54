"""quantize's FP16 probe keeps one op off the target EP where the EP alone computes the FP16 file
otherwise (steps/quantize/fp16_off_ep.py): the order it tries op types in, the command it names,
and, on QNN's HTP simulator, a model QNN computes wrongly (a GELU's shape that is not a GELU:
QNN011) named with its Erf kept off, the command writing the file the gate judged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import models
from ep_marks import needs_qnn, on_x86
from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions
from ortprep.steps.quantize.fp16_off_ep import keep_off_command, op_sets


def test_approximated_ops_come_first_then_the_fewest_nodes():
    sets = op_sets(models.erf_gelu())  # MatMul, Div, Erf, Add, Mul, Mul: 6 compute nodes
    assert [op for op, _ in sets] == ["Erf", "Add", "Div", "MatMul"]  # Mul's 2 of 6 are over a quarter
    assert sets[0][1] == ["gelu/erf"]


def test_an_op_with_an_unnamed_node_is_not_a_set():
    model = models.erf_gelu()
    model.graph.node[2].name = ""  # the Erf
    assert "Erf" not in [op for op, _ in op_sets(model)]


def test_the_command_keeps_the_nodes_off_before_its_output():
    command = "ortprep convert 'run -o 2/m.onnx' --fp16 --ep qnn --keep-io-types -o 'run -o 2/m.fp16.onnx'"
    assert keep_off_command(command, ["a b", "c"]) == (
        "ortprep convert 'run -o 2/m.onnx' --fp16 --ep qnn --keep-io-types --keep-off-ep 'a b' --keep-off-ep c "
        "-o 'run -o 2/m.fp16.onnx'")


@on_x86
@needs_qnn
@pytest.mark.parametrize("auto_exclude", [False, True])
def test_the_probe_keeps_the_erf_qnn_computes_wrongly_off_it(tmp_path, auto_exclude):
    from ortprep.runtime.worker import workers_scope
    from ortprep.steps.quantize.fp16_probe import measure_fp16
    from cli_helpers import invoke

    path = tmp_path / "shape.onnx"
    onnx.save(models.erf_gelu(divisor=10.0), str(path))  # QNN builds it as a GELU (QNN011)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(5)
    for index in range(12):
        np.savez(calib / f"{index:03d}.npz", x=rng.normal(size=(1, 8, 16)).astype(np.float32))
    options = QuantizeOptions(mode="static", ep="qnn", auto=True, auto_exclude=auto_exclude, calib=calib)
    with workers_scope():
        probe = measure_fp16(ModelHandle.open(path), options)
    if not auto_exclude:  # the search is --auto-exclude's: FP16 fails on QNN alone, and says so
        assert probe["passed"] is False and probe["ep_only"] is True and probe["kept_off_ep"] is None
        return
    assert probe["passed"] is True, probe
    assert probe["kept_off_ep"]["op"] == "Erf" and probe["kept_off_ep"]["nodes"] == ["gelu/erf"]
    assert probe["kept_off_ep"]["tried"][0] == {**probe["kept_off_ep"]["tried"][0], "op": "Erf", "passed": True}
    assert "--keep-off-ep gelu/erf -o " in probe["command"]
    assert probe["placement"]["nodes_on_ep"] < probe["placement"]["nodes_total"]
    # the named command writes the file the gate judged, and load on QNN holds it
    words = probe["command"].split()[1:]
    out = tmp_path / "named.fp16.onnx"
    words[words.index("-o") + 1] = str(out)
    assert invoke(*words).exit_code == 0
    loaded = invoke("load", out, "--ep", "qnn", "--inputs", calib / "000.npz", "--json")
    assert loaded.exit_code == 0, loaded.stdout[-1500:]
