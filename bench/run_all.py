"""make bench: run every benchmark in one go and write their figures into bench/RESULTS.md.

    .venv/bin/python bench/run_all.py

Each section of RESULTS.md that a script produces gets that script's fresh tables, in order,
in place of the old ones; the text around them (how to read the figures) stays, and the dates
in the section's command line are set to today. The header describes the machine the run used.
Sections no script on this machine can produce (the op probes, the GPU run) are left as they are
and say how they were made.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
# (section heading prefix, script): the order they run in
SCRIPTS = [
    ("## inspect reads no weights", "bench/bench_inspect.py"),
    ("## check on 10,000 nodes", "bench/bench_check.py"),
    ("## FP16 conversion", "bench/bench_fp16.py"),
    ("## FP16 of weights that do not fit in memory", "bench/bench_fp16_stream.py"),
    ("## Quantization: calibration memory", "bench/bench_quantize.py"),
    ("## load overhead", "bench/bench_load.py"),
    ("## check against the real QNN and OpenVINO EPs", "bench/bench_check_vs_real.py"),
    ("## Transforms on real models with realistic inputs", "bench/bench_corpus.py"),
    ("## The repository gate: -j", "bench/bench_repo.py"),
    ("## One worker protocol", "bench/bench_worker.py"),
    ("## Reducing a failing session to its culprit", "bench/bench_prove.py"),
    ("## The NPU journey (issue 20)", "bench/journey.py"),
    # the journey's QDQ models on 400 fresh inputs: its first table (the other two are session 12's
    # files and hand-made QDQ files, left as they are)
    ("## Decisions on 400 fresh inputs", "bench/decision_rates.py"),
    ("## Applications: ortprep's outputs swapped into real apps", "bench/apps/run.py"),
    ("## Weight-only quantization (issue 22)", "bench/bench_weight_only.py"),
    # after the journey: it quantizes the float models the journey wrote
    ("## int8 on the CPU: what ortprep writes", "bench/quantize_yield.py"),
    # after the yield run: its written files judged again on 1,000 fresh inputs
    ("## int8 files on 1,000 fresh inputs", "bench/remeasure.py"),
    # after the yield run: it times the int8 files that run left
    ("## int8 against float, timed in pairs", "bench/int8_latency.py"),
]


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
    return (f"Every figure below comes from the command given with it. The sections marked with a command of\n"
            f"`bench/run_all.py` (`make bench`) were measured in one run on {datetime.date.today().isoformat()}:\n"
            f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB memory, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, {', '.join(versions)}.\n"
            "Times are medians of fresh processes (import time included) unless a section says otherwise; peak RSS\n"
            "is the largest process's own peak resident set (see `bench/common.py`).\n")


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


def main() -> int:
    text = RESULTS.read_text()
    head, _, rest = text.partition("\n## ")
    rest = "## " + rest
    sections = re.split(r"(?m)^(?=## )", rest)
    today = datetime.date.today().isoformat()
    for heading, script in SCRIPTS:
        print(f"running {script}", file=sys.stderr, flush=True)
        child = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True)
        if child.returncode != 0:
            print(f"{script} failed; its section is left as it was:\n{child.stderr[-2000:]}", file=sys.stderr)
            continue
        output = child.stdout
        if script.endswith("bench_check_vs_real.py"):
            output = (ROOT / "bench" / "out" / "real" / "table.md").read_text()
        for position, section in enumerate(sections):
            if section.startswith(heading):
                updated = replace_tables(section, tables(output))
                if "Over " in output:
                    summary = next(line for line in output.splitlines() if line.startswith("Over "))
                    updated = re.sub(r"(?m)^Over \d+ sessions:.*$", summary, updated)
                sections[position] = re.sub(r"\(\d{4}-\d\d-\d\d", f"({today}", updated, count=1)
    RESULTS.write_text("# Benchmark results\n\n" + machine() + "\n" + "".join(sections))
    print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
