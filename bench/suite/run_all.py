"""make bench: run every benchmark of the suite in one go, each refreshing its own results table.

    .venv/bin/python -m bench.suite.run_all

Each script runs as a module from the repository root; the tables it prints replace, in order, the
tables of its section in its results file (bench/suite/results/NAME.md); the text around them (how
to read the figures) stays, and the date in the section's command line is set to today. The
machine paragraph of bench/RESULTS.md (the one-page summary) describes the run. Files no script
produces (the studies, the history) are left as they are and say how they were made.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import subprocess
import sys

from bench.paths import BENCH, OUT, ROOT

RESULTS = BENCH / "RESULTS.md"
TABLES = BENCH / "suite" / "results"
# (module, results file in bench/suite/results, the heading of the section it refreshes): in run order
SCRIPTS = [
    ("bench.suite.bench_inspect", "bench_inspect.md", "## inspect reads no weights"),
    ("bench.suite.bench_check", "bench_check.md", "## check on 10,000 nodes"),
    ("bench.suite.bench_fp16", "bench_fp16.md", "## FP16 conversion"),
    ("bench.suite.bench_fp16_stream", "bench_fp16_stream.md", "## FP16 of weights that do not fit in memory"),
    ("bench.suite.bench_quantize", "bench_quantize.md", "## Quantization: calibration memory"),
    ("bench.suite.bench_load", "bench_load.md", "## load overhead"),
    ("bench.suite.bench_check_vs_real", "bench_check_vs_real.md", "## check against the real QNN and OpenVINO EPs"),
    ("bench.suite.bench_corpus", "bench_corpus.md", "## Transforms on real models with realistic inputs"),
    ("bench.suite.bench_repo", "bench_repo.md", "## The repository gate: -j"),
    ("bench.suite.bench_worker", "bench_worker.md", "## One worker protocol"),
    ("bench.suite.bench_prove", "bench_prove.md", "## Reducing a failing session to its culprit"),
    ("bench.suite.journey", "journey.md", "## The NPU journey (issue 20)"),
    # the journey's QDQ models on 400 fresh inputs: its first table (the other two are session 12's
    # files and hand-made QDQ files, left as they are)
    ("bench.suite.decision_rates", "decision_rates.md", "## Decisions on 400 fresh inputs"),
    ("bench.suite.apps.run", "apps.md", "## Applications: ortprep's outputs swapped into real apps"),
    ("bench.suite.bench_weight_only", "bench_weight_only.md", "## Weight-only quantization (issue 22)"),
    # after the journey: it quantizes the float models the journey wrote
    ("bench.suite.quantize_yield", "quantize_yield.md", "## int8 on the CPU: what ortprep writes"),
    # after the yield run: its written files judged again on 1,000 fresh inputs
    ("bench.suite.remeasure", "remeasure.md", "## int8 files on 1,000 fresh inputs"),
    # after the yield run: it times the int8 files that run left
    ("bench.suite.int8_latency", "int8_latency.md", "## int8 against float, timed in pairs"),
    # the engines plain and under ortprep's gate (issue 51); it writes its whole file itself
    ("bench.suite.engines", "engines.md", "## Summary (evaluation half)"),
]
MACHINE_START, MACHINE_END = "<!-- machine -->", "<!-- /machine -->"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = []
    for name in ("onnx", "onnxruntime", "onnxruntime-qnn", "onnxconverter-common", "onnxsim", "numpy"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return (
        f"The suite's tables were last measured in one run of `make bench` on {datetime.date.today().isoformat()}:\n"
        f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB memory, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, {', '.join(versions)}.\n"
        "Times are medians of fresh processes (import time included) unless a section says otherwise; peak RSS\n"
        "is the largest process's own peak resident set (see `bench/common.py`).\n"
    )


def tables(text: str) -> list[list[str]]:
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    if current:
        found.append(current)
    return found


def replace_tables(section: str, fresh: list[list[str]]) -> str:
    lines, out, index, in_table = section.splitlines(), [], 0, False
    for line in lines:
        if line.startswith("|"):
            if not in_table:
                in_table = True
                if index < len(fresh):
                    out.extend(fresh[index])
                index += 1
            if index > len(fresh):
                out.append(line)  # more old tables than fresh ones: keep the old
            continue
        in_table = False
        out.append(line)
    return "\n".join(out) + ("\n" if section.endswith("\n") else "")


def refresh(path, heading: str, output: str) -> None:
    """The tables of ``output`` in place of those of the section under ``heading`` in ``path``."""
    text = path.read_text()
    sections = re.split(r"(?m)^(?=## )", text)
    today = datetime.date.today().isoformat()
    for position, section in enumerate(sections):
        if section.startswith(heading):
            updated = replace_tables(section, tables(output))
            if "Over " in output:
                summary = next(line for line in output.splitlines() if line.startswith("Over "))
                updated = re.sub(r"(?m)^Over \d+ sessions:.*$", summary, updated)
            sections[position] = re.sub(r"\(\d{4}-\d\d-\d\d", f"({today}", updated, count=1)
    path.write_text("".join(sections))


def main() -> int:
    for module, name, heading in SCRIPTS:
        print(f"running {module}", file=sys.stderr, flush=True)
        child = subprocess.run([sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True)
        if child.returncode != 0:
            print(f"{module} failed; its table is left as it was:\n{child.stderr[-2000:]}", file=sys.stderr)
            continue
        output = child.stdout
        if module.endswith("bench_check_vs_real"):
            output = (OUT / "real" / "table.md").read_text()
        refresh(TABLES / name, heading, output)
    summary = RESULTS.read_text()
    start, end = summary.index(MACHINE_START) + len(MACHINE_START), summary.index(MACHINE_END)
    RESULTS.write_text(summary[:start] + "\n" + machine() + summary[end:])
    print(f"wrote {TABLES.relative_to(ROOT)}/ and the machine line of {RESULTS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
