"""FP16 conversion: ortprep convert --fp16 (range scan, repairs, verification in ORT) next to
calling onnxconverter-common directly on the same model (no checks, no verification).
Run: .venv/bin/python -m bench.suite.bench_fp16
"""

from __future__ import annotations

import shutil
import sys

from bench.common import OUT, VENV_BIN, chain_model, measure, table

DIRECT = (
    "import onnx, warnings; warnings.simplefilter('ignore');"
    "from onnxconverter_common import float16;"
    "m = onnx.load({src!r});"
    "onnx.save_model(float16.convert_float_to_float16(m, keep_io_types=True), {dst!r}, save_as_external_data=True)"
)


def main() -> None:
    rows = []
    for label, blocks, width in (("400 nodes, 40 MB", 100, 320), ("4,000 nodes, 400 MB", 1000, 320)):
        folder = OUT / f"fp16_{blocks}"
        path = chain_model(folder, blocks=blocks, width=width, realistic=True)
        ortprep = str(VENV_BIN / "ortprep")
        rows.append(
            (
                label,
                measure(
                    "ortprep convert --fp16 --ep cuda (verified)",
                    [
                        ortprep,
                        "convert",
                        str(path),
                        "--fp16",
                        "--ep",
                        "cuda",
                        "-o",
                        str(folder / "a.onnx"),
                        "--force",
                        "--json",
                    ],
                    runs=1,
                ),
            )
        )
        rows.append(
            (
                label,
                measure(
                    "ortprep convert --fp16 --ep cuda --no-verify",
                    [
                        ortprep,
                        "convert",
                        str(path),
                        "--fp16",
                        "--ep",
                        "cuda",
                        "--no-verify",
                        "-o",
                        str(folder / "b.onnx"),
                        "--force",
                        "--json",
                    ],
                    runs=1,
                ),
            )
        )
        rows.append(
            (
                label,
                measure(
                    "onnxconverter-common convert_float_to_float16",
                    [sys.executable, "-c", DIRECT.format(src=str(path), dst=str(folder / "c.onnx"))],
                    runs=1,
                ),
            )
        )
        shutil.rmtree(folder)
    print(table(rows))


if __name__ == "__main__":
    main()
