"""Run ortprep on mutated sample models and report any internal error (exit 4), traceback or hang.

    .venv/bin/python tools/fuzz.py [--cases N] [--commands inspect,check,convert,fixshape,load,quantize,qstatic]

Exit 1 when a case failed; each failure is printed with its seed and case number, so
`tools.fuzz_cases.mutate(seed, case)` replays it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.fuzz_cases import mutate  # noqa: E402

SEEDS = ["cnn.onnx", "transformer_block.onnx", "control_flow.onnx", "conv1d_audio.onnx", "custom_op.onnx"]
COMMANDS = {
    "inspect": ["inspect", "{model}", "--json"],
    "check": ["check", "{model}", "--ep", "cpu", "--ep", "dml-npu", "--ep", "qnn", "--json"],
    "convert": ["convert", "{model}", "--fp16", "-o", "{out}", "--json"],
    # the first input with a dynamic dimension fixed (each such dimension 2): static-shape
    # propagation, ORT's symbolic inference and the folding of shape computations
    "fixshape": ["convert", "{model}", "--fix-shape", "{shape}", "-o", "{out}", "--json"],
    "load": ["load", "{model}", "--ep", "cpu", "--runs", "1", "--timeout", "20", "--json"],
    "quantize": ["quantize", "{model}", "--dynamic", "-o", "{out}", "--json"],
    "qstatic": ["quantize", "{model}", "--static", "--calib", "random", "--samples", "12", "-o", "{out}", "--json"],
}


def _dynamic_input(data: bytes) -> str:
    """NAME=D,D,... for the first graph input with a dimension that is not a number (each such
    dimension 2, the rest as they are); "x=1" when the bytes are no model or nothing is dynamic."""
    import onnx

    try:
        graph = onnx.load_from_string(data).graph
    except Exception:  # noqa: BLE001 - a mutation that broke the protobuf: convert says so itself
        return "x=1"
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []
        if dims and any(not d.HasField("dim_value") for d in dims):
            return f"{value.name}=" + ",".join(str(d.dim_value) if d.HasField("dim_value") else "2" for d in dims)
    return "x=1"


def run_case(seed: Path, case: int, command: str, work: Path, timeout: float) -> str | None:
    kind, data = mutate(seed.read_bytes(), case)
    model = work / f"case{case}.onnx"
    model.write_bytes(data)
    args = [a.format(model=model, out=work / f"out{case}.onnx", shape=_dynamic_input(data)) for a in COMMANDS[command]]
    try:
        child = subprocess.run(
            [sys.executable, "-m", "ortprep", *args], capture_output=True, text=True, timeout=timeout, cwd=work
        )
    except subprocess.TimeoutExpired:
        return f"{seed.name} case {case} ({kind}) {command}: hung past {timeout:.0f} s"
    if child.returncode == 4 or "Traceback" in child.stderr:
        line = (child.stderr.strip().splitlines() or ["?"])[-1]
        return f"{seed.name} case {case} ({kind}) {command}: exit {child.returncode}: {line[:300]}"
    if child.returncode not in (0, 1, 2, 3):
        return f"{seed.name} case {case} ({kind}) {command}: exit {child.returncode}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--commands", default="inspect,check,convert,fixshape,load,quantize,qstatic")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    commands = args.commands.split(",")
    failures = []
    with tempfile.TemporaryDirectory(prefix="ortprep-fuzz-") as tmp:
        work = Path(tmp)
        for case in range(args.cases):
            seed = ROOT / "sample_models" / SEEDS[case % len(SEEDS)]
            command = commands[(case // len(SEEDS)) % len(commands)]
            failure = run_case(seed, case, command, work, args.timeout)
            if failure:
                failures.append(failure)
                print(failure, flush=True)
            if case % 100 == 99:
                print(f"{case + 1} cases, {len(failures)} failures", file=sys.stderr, flush=True)
    print(f"{args.cases} cases over {', '.join(commands)}: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
