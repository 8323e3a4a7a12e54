"""check on a model of 10,000 nodes with about 1 GB of external weights, next to ORT's own
mobile usability checker on the same model. Run: .venv/bin/python bench/bench_check.py

Prints a Markdown table for bench/RESULTS.md. The model goes to bench/out/ (ignored by git).
"""

from __future__ import annotations

import shutil
import sys

from common import OUT, VENV_BIN, chain_model, measure, table


def main() -> None:
    folder = OUT / "check_10k"
    path = chain_model(folder, blocks=2500, width=320)
    ortprep = str(VENV_BIN / "ortprep")
    rows = [
        ("10k nodes, 1 GB", measure("ortprep check --ep dml --json", [ortprep, "check", str(path), "--ep", "dml", "--json"])),
        ("10k nodes, 1 GB", measure("ortprep check --ep nnapi --json", [ortprep, "check", str(path), "--ep", "nnapi", "--json"])),
        (
            "10k nodes, 1 GB",
            measure(
                "ortprep check, 4 EPs",
                [ortprep, "check", str(path), "--ep", "cpu", "--ep", "dml-npu", "--ep", "tensorrt", "--ep", "qnn", "--json"],
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
    print(table(rows))


if __name__ == "__main__":
    main()
