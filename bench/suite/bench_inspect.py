"""inspect on models with 10 MB and 1 GB of external weights, next to the onnx calls a user
would make instead. Run: .venv/bin/python -m bench.suite.bench_inspect

Prints a Markdown table for bench/suite/results/bench_inspect.md. Generated models go to bench/out/ (ignored by git).
"""

from __future__ import annotations

import shutil
import sys

from bench.common import OUT, VENV_BIN, measure, model_with_external_weights, table

SIZES = {"10 MB": 10 * 2**20, "1 GB": 2**30}


def main() -> None:
    rows = []
    for label, size in SIZES.items():
        folder = OUT / f"inspect_{label.replace(' ', '')}"
        path = model_with_external_weights(folder, size)
        rows.append(
            (label, measure("ortprep inspect --json", [str(VENV_BIN / "ortprep"), "inspect", str(path), "--json"]))
        )
        rows.append(
            (
                label,
                measure(
                    "onnx.load (weights included)",
                    [sys.executable, "-c", f"import onnx; onnx.load({str(path)!r})"],
                ),
            )
        )
        rows.append(
            (
                label,
                measure(
                    "onnx.load(load_external_data=False) + checker",
                    [
                        sys.executable,
                        "-c",
                        f"import onnx; m = onnx.load({str(path)!r}, load_external_data=False); "
                        f"onnx.checker.check_model({str(path)!r}, full_check=True)",
                    ],
                ),
            )
        )
        shutil.rmtree(folder)
    print(table(rows))


if __name__ == "__main__":
    main()
