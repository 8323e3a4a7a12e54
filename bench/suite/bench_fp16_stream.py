"""FP16 of models whose weights do not belong in memory: ortprep's streamed path next to the bare
converter (onnx.load + onnxconverter-common + onnx.save_model), in one run.

    .venv/bin/python -m bench.suite.bench_fp16_stream [--gb 8.5] [--limit-gb 18]

The models are MatMul fan-outs whose weights are normal floats (scaled like trained layers) in
one external file, built by streaming to disk. The bare converter runs under an address-space
limit (--limit-gb) so that running out of memory is a MemoryError in that process, not the
kernel's OOM killer on this machine. Peak RSS is the largest resident set of the command's
process tree (ORT's verification child included when it runs).
"""

from __future__ import annotations

import argparse
import shutil
import sys

from bench.common import OUT, VENV_BIN, measure, model_with_external_weights, table

BARE = (
    "import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}));"
    "import onnx, warnings; warnings.simplefilter('ignore');"
    "from onnxconverter_common import float16;"
    "m = onnx.load({src!r});"
    "m = float16.convert_float_to_float16(m, keep_io_types=True);"
    "onnx.save_model(m, {dst!r}, save_as_external_data=True, all_tensors_to_one_file=True, location='bare.onnx.data')"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=8.5)
    parser.add_argument("--limit-gb", type=float, default=18.0)
    args = parser.parse_args()
    ortprep = str(VENV_BIN / "ortprep")
    limit = int(args.limit_gb * 2**30)
    rows = []
    for gb, verify in ((1.0, True), (args.gb, False), (args.gb, True)):
        label = f"{gb:g} GB of float32 weights"
        folder = OUT / f"fp16_stream_{gb:g}"
        model = folder / "model.onnx"
        if not model.exists():
            print(f"building {label} ...", file=sys.stderr, flush=True)
            model_with_external_weights(folder, int(gb * 2**30), tensors=16, rows=4096, realistic=True)
        argv = [ortprep, "convert", str(model), "--fp16", "-o", str(folder / "ortprep.onnx"), "--force", "--json"]
        name = (
            "ortprep convert --fp16 (streamed, verified)" if verify else "ortprep convert --fp16 --no-verify (streamed)"
        )
        rows.append((label, measure(name, argv + ([] if verify else ["--no-verify"]), runs=1)))
        if verify == (gb == 1.0):  # once per size
            bare = [sys.executable, "-c", BARE.format(limit=limit, src=str(model), dst=str(folder / "bare.onnx"))]
            rows.append(
                (
                    label,
                    measure(
                        f"onnx.load + convert_float_to_float16 + save (address space <= {args.limit_gb:g} GB)",
                        bare,
                        runs=1,
                    ),
                )
            )
        for leftover in ("ortprep.onnx.data", "bare.onnx.data"):
            (folder / leftover).unlink(missing_ok=True)
    print(table(rows))
    for gb in (1.0, args.gb):
        shutil.rmtree(OUT / f"fp16_stream_{gb:g}", ignore_errors=True)


if __name__ == "__main__":
    main()
