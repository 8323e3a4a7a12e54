"""Ctrl-C and SIGTERM during long work: one line, exit 130/143, no partial output, no temp files in
the output folder or the working directory, no child process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT, SAMPLES


def big_model(path: Path) -> Path:
    """24 MatMuls over 512x512 weights: FP16 conversion with verification takes seconds."""
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range(24):
        inits.append(numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32) * 0.05, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        current = f"t{i}"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [64, 512])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds child processes through /proc")
@pytest.mark.parametrize("how, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("command", ["convert", "quantize", "load"])
def test_interrupt_leaves_nothing_behind(tmp_path, how, code, command):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    marker = f"ORTPREP_TEST_MARKER={uuid.uuid4().hex}"
    temp = tmp_path / "tmp"  # the run's temp folder: it must be empty at the end (workers' logs included)
    temp.mkdir()
    # The work's requests wait 30 s in the worker first, so the signal surely lands while it is under
    # way (for load: in the thread that waits on the first EP, with a second EP still to come).
    delay = {"convert": "RunModel:30", "quantize": "Quantize:30", "load": "Placement:30"}[command]
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1], "PYTHONPATH": str(ROOT), "TMPDIR": str(temp),
           "ORTPREP_TEST_WORKER_DELAY": delay}
    if command == "convert":
        args = ["convert", str(big_model(tmp_path / "big.onnx")), "--fp16", "-o", str(out_dir / "big.fp16.onnx")]
    elif command == "quantize":
        args = [
            "quantize",
            str(big_model(tmp_path / "big.onnx")),
            "--static",
            "--calib",
            "random",
            "--method",
            "entropy",
            "-o",
            str(out_dir / "big.int8.onnx"),
        ]
    else:
        # two EPs: the interrupt must stop the step, not just the EP running (the next one must not start)
        args = ["load", str(SAMPLES / "transformer_block.onnx"), "--ep", "cpu", "--ep", "qnn", "--runs", "100000000",
                "--report", str(out_dir / "report.json")]
    # A test run started in the background (`nohup cmd &` from a script) inherits SIGINT ignored
    # (seen here: SigIgn 0x7), and a process that starts with SIGINT ignored keeps it so: the child
    # gets the default disposition a terminal's Ctrl-C meets, which is what this test is about.
    child = subprocess.Popen([sys.executable, "-m", "ortprep", *args], cwd=work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(processes_with(marker)) < 2 and time.monotonic() < deadline:  # wait for the ORT child
        time.sleep(0.05)
    assert len(processes_with(marker)) >= 2, "the work never reached its child process"
    time.sleep(1.0)
    started = time.monotonic()
    child.send_signal(how)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == code, stderr
    assert time.monotonic() - started < 10  # at once, not after the worker's 30 s (or the next EP's)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and ("interrupted" in lines[0] or "terminated" in lines[0]), stderr
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []  # no orphaned worker
    assert list(out_dir.iterdir()) == [] and list(work.iterdir()) == []  # no output, no temp files
    # ONNX Runtime 1.32 itself keeps a session id in $TMPDIR/.ses (its usage telemetry, written at
    # import; strace shows it beside ~/.cache/Microsoft/DeveloperTools/.onnxruntime): not ortprep's.
    assert [p.name for p in temp.iterdir() if p.name != ".ses"] == []
