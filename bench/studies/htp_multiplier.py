"""Conclusion (session 11, 2026-11-26; bench/studies/htp_multiplier.md): on QNN's HTP a per-channel
Conv channel whose requantization multiplier (input scale x weight scale / output scale) falls below
2^-24 outputs garbage (8 to 70 where about 0 is right); quantize --ep qnn now raises such channels to
2^-23 (QNT020), which took PP-OCRv4's detector on QNN from cosine 0.35 to 0.9972.

Where QNN's HTP stops computing a per-channel QDQ Conv channel right (bench/studies/htp_multiplier.md, "QNN's
smallest requantization multiplier"): a hand-built QDQ Conv (16 channels, 1x1, uint16 activations,
int8 per-channel weights), one output channel's weights scaled down by RATIO, run on the CPU EP and
on QNN's HTP simulator (ortprep's default device); printed per case: that channel's
requantization multiplier (input scale x weight scale / output scale, log2), the channel's largest
output on both EPs and the whole output's relative error (QNN against the CPU EP).

    .venv/bin/python -m bench.studies.htp_multiplier [RATIO ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortprep import QuantizeOptions, StepResult, gate_target, run_isolated

CHANNELS = 16


def qdq_conv(rng: np.random.Generator, channel_max: np.ndarray) -> tuple[onnx.ModelProto, float]:
    """The QDQ Conv with the given per-channel weight magnitudes, and the last channel's multiplier."""
    c = CHANNELS
    w = rng.standard_normal((c, c, 1, 1)).astype(np.float32)
    w = w / np.abs(w).reshape(c, -1).max(1).reshape(c, 1, 1, 1) * channel_max.reshape(c, 1, 1, 1)
    w_scale = (channel_max / 127).astype(np.float32)
    w_q = np.clip(np.round(w / w_scale.reshape(c, 1, 1, 1)), -127, 127).astype(np.int8)
    x_scale, y_scale = np.float32(8 / 65535), np.float32(c * 4 * 2.2 / 65535)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"])]
    inits = [
        numpy_helper.from_array(np.array(x_scale), "xs"),
        numpy_helper.from_array(np.array(32768, np.uint16), "xz"),
        numpy_helper.from_array(w_q, "wq"),
        numpy_helper.from_array(w_scale, "ws"),
        numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
        numpy_helper.from_array(np.array(y_scale), "ys"),
        numpy_helper.from_array(np.array(32768, np.uint16), "yz"),
    ]
    graph = helper.make_graph(nodes, "qdq_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, c, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return model, float(x_scale) * float(w_scale[-1]) / float(y_scale)


def main(ratios: list[float]) -> None:
    target = gate_target(QuantizeOptions(ep="qnn"), StepResult("quantize", "ortprep.quantize/1"))
    if not target.judged:
        raise SystemExit(f"QNN's HTP simulator does not run here: {target.reason}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, CHANNELS, 8, 8)).astype(np.float32)
    print("| ratio | multiplier (log2) | small channel max, CPU EP | on QNN | whole output: rel. error |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for ratio in ratios:
            channel_max = np.ones(CHANNELS, np.float32)
            channel_max[-1] = 1.0 / ratio
            model, multiplier = qdq_conv(rng, channel_max)
            path = Path(tmp) / "qdq_conv.onnx"
            onnx.save(model, str(path))
            cpu = np.asarray(run_isolated(path, [{"x": x}]).samples[0]["out"])
            qnn = np.asarray(target.run(path, [{"x": x}]).samples[0]["out"])
            error = np.linalg.norm(cpu - qnn) / np.linalg.norm(cpu)
            print(
                f"| {ratio:g} | {np.log2(multiplier):.2f} | {np.abs(cpu[:, -1]).max():.3g} | "
                f"{np.abs(qnn[:, -1]).max():.3g} "
                f"| {error:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main([float(a) for a in sys.argv[1:]] or [1e3, 1e4, 2e4, 3e4, 4e4, 5e4, 6e4, 7e4, 8e4, 1e5, 2e5])
