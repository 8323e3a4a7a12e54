"""The overhead of `ortprep load` against creating one InferenceSession and running it.
Run: .venv/bin/python -m bench.suite.bench_load
"""

from __future__ import annotations

import sys

from bench.common import ROOT, VENV_BIN, measure, table

BARE = (
    "import numpy as np, onnxruntime as ort; "
    "s = ort.InferenceSession({path!r}, providers=['CPUExecutionProvider']); "
    "feeds = {{i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in "
    "i.shape]).astype(np.float32) "
    "for i in s.get_inputs()}}; "
    "[s.run(None, feeds) for _ in range(11)]"
)


def main() -> None:
    rows = []
    for name in ("cnn.onnx", "transformer_block.onnx"):
        path = str(ROOT / "sample_models" / name)
        rows.append(
            (
                name,
                measure(
                    "ortprep load --ep cpu --json (10 timed runs)",
                    [str(VENV_BIN / "ortprep"), "load", path, "--ep", "cpu", "--json"],
                ),
            )
        )
        rows.append((name, measure("bare InferenceSession + 11 runs", [sys.executable, "-c", BARE.format(path=path)])))
    print(table(rows))


if __name__ == "__main__":
    main()
