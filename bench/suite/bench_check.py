"""check on a model of 10,000 nodes with about 1 GB of external weights, and on a chain of
100,000 nodes (issue 23: at most 5 s and 500 MB for --ep cpu --ep qnn), next to ORT's own mobile
usability checker and onnx's checker on the same models. Run: .venv/bin/python -m bench.suite.bench_check

Prints a Markdown table for bench/suite/results/bench_check.md. The model goes to bench/out/ (ignored by git).
"""

from __future__ import annotations

import shutil
import sys

from bench.common import OUT, VENV_BIN, chain_model, measure, table


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["10k", "100k"], help="run one model's rows")
    only = parser.parse_args().only
    rows = [] if only == "100k" else ten_thousand()
    if only != "10k":
        rows += hundred_thousand()
    print(table(rows))


def ten_thousand() -> list:
    folder = OUT / "check_10k"
    path = chain_model(folder, blocks=2500, width=320)
    ortprep = str(VENV_BIN / "ortprep")
    rows = [
        (
            "10k nodes, 1 GB",
            measure("ortprep check --ep dml --json", [ortprep, "check", str(path), "--ep", "dml", "--json"]),
        ),
        (
            "10k nodes, 1 GB",
            measure("ortprep check --ep nnapi --json", [ortprep, "check", str(path), "--ep", "nnapi", "--json"]),
        ),
        (
            "10k nodes, 1 GB",
            measure(
                "ortprep check, 4 EPs",
                [
                    ortprep,
                    "check",
                    str(path),
                    "--ep",
                    "cpu",
                    "--ep",
                    "dml-npu",
                    "--ep",
                    "tensorrt",
                    "--ep",
                    "qnn",
                    "--json",
                ],
            ),
        ),
        (
            "10k nodes, 1 GB",
            measure(
                "python -m onnxruntime.tools.check_onnx_model_mobile_usability",
                [sys.executable, "-m", "onnxruntime.tools.check_onnx_model_mobile_usability", str(path)],
            ),
        ),
    ]
    shutil.rmtree(folder)
    return rows


def hundred_thousand() -> list:
    ortprep = str(VENV_BIN / "ortprep")
    folder = OUT / "check_100k"
    path = chain_model(folder, blocks=25000, width=32)
    rows = [
        (
            "100k nodes, 100 MB",
            measure(
                "ortprep check --ep cpu --ep qnn --json",
                [ortprep, "check", str(path), "--ep", "cpu", "--ep", "qnn", "--json"],
            ),
        ),
        (
            "100k nodes, 100 MB",
            measure(
                "onnx.checker.check_model (by path, full_check)",
                [
                    sys.executable,
                    "-c",
                    "import onnx, sys; onnx.checker.check_model(sys.argv[1], full_check=True)",
                    str(path),
                ],
            ),
        ),
        (
            "100k nodes, 100 MB",
            measure(
                "python -m onnxruntime.tools.check_onnx_model_mobile_usability",
                [sys.executable, "-m", "onnxruntime.tools.check_onnx_model_mobile_usability", str(path)],
                runs=1,
            ),
        ),
    ]
    shutil.rmtree(folder)
    return rows


if __name__ == "__main__":
    main()
