"""Run ortprep on mutated sample models and report any internal error (exit 4), traceback or hang.

    .venv/bin/python tools/fuzz.py [--mode fields|bytes] [--cases N] [--start K] [--workers W]
        [--commands inspect,check,convert,fixshape,load,quantize,qstatic] [--seeds cnn.onnx,...] [--json]

``--mode fields`` (the default, and `make fuzz`) parses each seed and mutates protobuf fields
(tools/fuzz_fields.py); ``--mode bytes`` flips and truncates bytes and applies the older
structural mutations (tools/fuzz_cases.py). Each case runs in a worker process that keeps ortprep
imported (a fresh interpreter per case costs seconds); a case past ``--timeout`` counts as a hang,
and its worker is replaced. Exit 1 when a case failed; each failure is printed with its seed, mode
and case number, so ``mutate_fields(seed, case)`` or ``mutate(seed, case)`` replays it.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEEDS = ["cnn.onnx", "transformer_block.onnx", "control_flow.onnx", "conv1d_audio.onnx", "custom_op.onnx"]
COMMANDS = {
    "inspect": ["inspect", "{model}", "--json"],
    "check": ["check", "{model}", "--ep", "cpu", "--ep", "dml-npu", "--ep", "qnn", "--json"],
    "convert": ["convert", "{model}", "--fp16", "-o", "{out}", "--json"],
    # the first input with a dynamic dimension fixed (each such dimension 2): static-shape
    # propagation, ORT's symbolic inference and the folding of shape computations
    "fixshape": ["convert", "{model}", "--fix-shape", "{shape}", "-o", "{out}", "--json"],
    "load": ["load", "{model}", "--ep", "cpu", "--runs", "1", "--timeout", "20", "--json"],
    # made-up inputs asked for (--eval random): without them the step refuses before any work (QNT033)
    "quantize": ["quantize", "{model}", "--dynamic", "--eval", "random", "-o", "{out}", "--json"],
    "qstatic": ["quantize", "{model}", "--static", "--calib", "random", "--samples", "12", "-o", "{out}", "--json"],
    # not in the default list (make fuzz's history compares like with like): --commands simplify,optimize
    "simplify": ["simplify", "{model}", "-o", "{out}", "--json"],
    "optimize": ["optimize", "{model}", "-o", "{out}", "--json"],
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


def mutated(mode: str, seed: Path, case: int) -> tuple[str, bytes]:
    if mode == "fields":
        from tools.fuzz_fields import mutate_fields

        return mutate_fields(seed.read_bytes(), case)
    from tools.fuzz_cases import mutate

    return mutate(seed.read_bytes(), case)


# --------------------------------------------------------------------------- the worker


def serve() -> None:
    """Worker: read one JSON request per line ({"args": [...]}), run the CLI in this process,
    answer {"exit": code, "last": the last stderr line, "traceback": bool}."""
    from typer.testing import CliRunner

    from ortprep.cli.app import app

    for line in sys.stdin:
        request = json.loads(line)
        result = CliRunner().invoke(app, request["args"])
        code = result.exit_code
        stderr = result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            code, stderr = 4, stderr + f"\nuncaught {type(result.exception).__name__}: {result.exception}"
        last = (stderr.strip().splitlines() or [""])[-1]
        reply = {"exit": code, "last": last[:300], "traceback": "Traceback" in stderr}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class Worker:
    """A child interpreter running ``serve``; replaced when a case hangs."""

    def __init__(self, cwd: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"], cwd=cwd, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, start_new_session=True)

    def run(self, args: list[str], timeout: float) -> dict | None:
        """The reply, or None when the case ran past ``timeout`` (the worker is then ended)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"args": args}) + "\n")
        self.process.stdin.flush()
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
        selector.close()
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            return None if not ready else {"exit": 4, "last": "the worker died", "traceback": False}
        return json.loads(line)

    def close(self) -> None:
        """End the worker and what it started (ORT's child processes), by its process group."""
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


# --------------------------------------------------------------------------- the run


def run_case(worker: Worker, mode: str, seed: Path, case: int, command: str, work: Path,
             timeout: float) -> tuple[int | str, str | None]:
    """(exit code or "hang", a failure line or None) of one case."""
    kind, data = mutated(mode, seed, case)
    model = work / f"case{case}.onnx"
    model.write_bytes(data)
    out = work / f"out{case}.onnx"
    args = [a.format(model=model, out=out, shape=_dynamic_input(data)) for a in COMMANDS[command]]
    reply = worker.run(args, timeout)
    for path in work.iterdir():  # the next cases start from an empty folder
        if path.is_file():
            path.unlink()
    where = f"{seed.name} {mode} case {case} ({kind}) {command}"
    if reply is None:
        return "hang", f"{where}: hung past {timeout:.0f} s"
    code = reply["exit"]
    if code == 4 or reply["traceback"] or code not in (0, 1, 2, 3):
        return code, f"{where}: exit {code}: {reply['last']}"
    return code, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["fields", "bytes"], default="fields")
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--start", type=int, default=0, help="first case number (to split a run)")
    parser.add_argument("--commands", default="inspect,check,convert,fixshape,load,quantize,qstatic")
    parser.add_argument("--seeds", default=",".join(SEEDS))
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON record")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    commands, seeds = args.commands.split(","), args.seeds.split(",")
    unknown = [c for c in commands if c not in COMMANDS]
    if unknown:
        parser.error(f"unknown commands {unknown}; known: {', '.join(COMMANDS)}")
    failures, codes = [], Counter()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ortprep-fuzz-") as tmp:
        work = Path(tmp)
        worker = Worker(work)
        for case in range(args.start, args.start + args.cases):
            seed = ROOT / "sample_models" / seeds[case % len(seeds)]
            command = commands[(case // len(seeds)) % len(commands)]
            code, failure = run_case(worker, args.mode, seed, case, command, work, args.timeout)
            codes[str(code)] += 1
            if code == "hang" or worker.process.poll() is not None:
                worker = Worker(work)
            if failure:
                failures.append(failure)
                print(failure, flush=True)
            if (case - args.start) % 100 == 99:
                print(f"{case - args.start + 1} cases, {len(failures)} failures, {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)
        worker.close()
    summary = {"mode": args.mode, "cases": args.cases, "start": args.start, "commands": commands,
               "exit_codes": dict(sorted(codes.items())), "failures": len(failures),
               "seconds": round(time.perf_counter() - started)}
    if args.json:
        print(json.dumps(summary))
    else:
        histogram = ", ".join(f"exit {code}: {count}" for code, count in sorted(codes.items()))
        print(f"{args.cases} {args.mode} cases over {', '.join(commands)} in {summary['seconds']} s: {histogram}; "
              f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
