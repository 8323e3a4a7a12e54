"""Static quantization memory: calibration peak RSS at 16 and 256 samples, ortprep next to
onnxruntime.quantization.quantize_static called directly on the same data; percentile
calibration of a model with 180 MB of activations per sample (ortprep's stride within its 512 MB
budget, quantize_static with all samples in one reader); and the int8/fp32 CPU latency ortprep
measures on the sample models.  Run: .venv/bin/python -m bench.suite.bench_quantize
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.common import OUT, ROOT, VENV_BIN, measure, table

SIDE = 112
CHANNELS = 16

DIRECT = """
import sys, glob, numpy as np
from onnxruntime.quantization import quantize_static, CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
files = sorted(glob.glob(sys.argv[1] + "/*.npz"))[: int(sys.argv[3])]
class Reader(CalibrationDataReader):
    def __init__(self): self.files = iter(files)
    def get_next(self):
        path = next(self.files, None)
        return None if path is None else dict(np.load(path))
quantize_static(sys.argv[2], sys.argv[4], Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method={"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                                  "percentile": CalibrationMethod.Percentile}[sys.argv[5]])
"""


def conv_model(path) -> None:
    """Six 3x3 convolutions at 112x112 with 16 channels: about 0.8 MB per activation tensor."""
    rng = np.random.default_rng(0)
    nodes, inits, x, cin = [], [], "image", 3
    for index in range(6):
        inits.append(
            numpy_helper.from_array(
                (rng.standard_normal((CHANNELS, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32), f"w{index}"
            )
        )
        nodes.append(helper.make_node("Conv", [x, f"w{index}"], [f"c{index}"], pads=[1, 1, 1, 1], name=f"conv{index}"))
        nodes.append(helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}"))
        x, cin = f"r{index}", CHANNELS
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="gap"))
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, CHANNELS, 1, 1])],
        inits,
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


WIDE = (1, 16, 400, 288)  # 7.0 MB per activation: a layout detector's early feature maps
WIDE_LAYERS = 26


def wide_model(path) -> None:
    """1x1 convolutions on a large feature map: 26 activations of 7.0 MB, 180 MB per sample."""
    rng = np.random.default_rng(2)
    nodes, inits, x = [], [], "image"
    for index in range(WIDE_LAYERS):
        inits.append(
            numpy_helper.from_array((rng.standard_normal((16, 16, 1, 1)) * 0.35).astype(np.float32), f"w{index}")
        )
        nodes.append(helper.make_node("Conv", [x, f"w{index}"], [f"c{index}"], name=f"conv{index}"))
        x = f"c{index}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="gap"))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("image", TensorProto.FLOAT, list(WIDE))],
                              [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 16, 1, 1])], inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def main() -> None:
    folder = OUT / "quantize"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "calib").mkdir(parents=True)
    model = folder / "convs.onnx"
    conv_model(model)
    rng = np.random.default_rng(1)
    for index in range(256):
        np.savez(folder / "calib" / f"{index:03d}.npz", image=rng.random((1, 3, SIDE, SIDE)).astype(np.float32))
    rows = []
    for method in ("minmax", "entropy"):
        for count in (16, 256):
            rows.append(
                (
                    f"{count} samples",
                    measure(
                        f"ortprep quantize --static --method {method} (20% held back for evaluation)",
                        [
                            str(VENV_BIN / "ortprep"),
                            "quantize",
                            str(model),
                            "--static",
                            "--calib",
                            str(folder / "calib"),
                            "--samples",
                            str(count),
                            "--method",
                            method,
                            "-o",
                            str(folder / "a.onnx"),
                            "--force",
                            "--json",
                            "--fail-on",
                            "never",
                        ],
                        runs=1,
                    ),
                )
            )
            rows.append(
                (
                    f"{count} samples",
                    measure(
                        f"quantize_static ({method}, all samples in one reader)",
                        [
                            sys.executable,
                            "-c",
                            DIRECT,
                            str(folder / "calib"),
                            str(model),
                            str(count),
                            str(folder / "b.onnx"),
                            method,
                        ],
                        runs=1,
                    ),
                )
            )
    wide = folder / "wide.onnx"
    wide_model(wide)
    (folder / "wide_calib").mkdir()
    for index in range(16):
        np.savez(folder / "wide_calib" / f"{index:03d}.npz", image=rng.standard_normal(WIDE).astype(np.float32))
    rows.append(("180 MB activations/sample, 16 samples", measure(
        "ortprep quantize --static --method percentile (stride within 512 MB)",
        [str(VENV_BIN / "ortprep"), "quantize", str(wide), "--static", "--calib", str(folder / "wide_calib"),
         "--method", "percentile", "-o", str(folder / "wa.onnx"), "--force", "--json", "--fail-on", "never"], runs=1)))
    rows.append(
        (
            "180 MB activations/sample, 16 samples",
            measure(
                "quantize_static (percentile, all samples in one reader)",
                [
                    sys.executable,
                    "-c",
                    DIRECT,
                    str(folder / "wide_calib"),
                    str(wide),
                    "16",
                    str(folder / "wb.onnx"),
                    "percentile",
                ],
                runs=1,
            ),
        )
    )
    print(table(rows))
    print()
    print("| sample model | int8 / fp32 CPU latency (median of 10 runs) | float ms | int8 ms |")
    print("|---|---:|---:|---:|")
    for name, input_name, shape in (
        ("cnn.onnx", "image", (1, 3, 32, 32)),
        ("transformer_block.onnx", "hidden", (1, 16, 64)),
    ):
        calib = folder / f"calib_{name}"
        calib.mkdir()
        for index in range(10):
            np.savez(calib / f"{index}.npz", **{input_name: rng.standard_normal(shape).astype(np.float32)})
        out = subprocess.run(
            [
                str(VENV_BIN / "ortprep"),
                "quantize",
                str(ROOT / "sample_models" / name),
                "--static",
                "--calib",
                str(calib),
                "-o",
                str(folder / f"q_{name}"),
                "--json",
                "--fail-on",
                "never",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        verify = json.loads(out.stdout)["verify"]
        print(
            f"| {name} | {verify['latency_ratio']} | {verify['float_latency_ms']:.3f} | "
            f"{verify['quant_latency_ms']:.3f} |"
        )
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
