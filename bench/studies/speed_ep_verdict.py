"""issue 51 point 3: the time `quantize --static --ep qnn --auto` takes on a 224x224 MobileNetV2-like
model against one HTP-simulator pass over its evaluation samples (docs/decisions/speed-ep-verdict.md).

    PYTHONPATH=. .venv/bin/python -m bench.studies.speed_ep_verdict build OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from bench.suite.journey_models import _conv, _vi, _Weights, make

# (expansion, channels, repeats, stride): MobileNetV2's inverted residual blocks
BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenet_v2(classes: int = 1000, width: float = 1.0, seed: int = 5) -> onnx.ModelProto:
    """MobileNetV2's layout at 1x3x224x224 (Conv+BatchNorm folded, ReLU for ReLU6), seeded weights."""
    w = _Weights(seed)
    nodes: list[onnx.NodeProto] = []
    channels = int(32 * width)
    nodes += _conv(w, "input", "stem", "stem", 3, channels, stride=2)
    x, index = "stem", 0
    for expansion, out_channels, repeats, stride in BLOCKS:
        out_channels = max(8, int(out_channels * width))
        for repeat in range(repeats):
            name = f"block{index}"
            hidden = channels * expansion
            y = x
            if expansion != 1:
                nodes += _conv(w, y, f"{name}.expand", f"{name}/expand", channels, hidden, k=1)
                y = f"{name}.expand"
            nodes += _conv(w, y, f"{name}.dw", f"{name}/dw", hidden, hidden, stride=stride if repeat == 0 else 1,
                           group=hidden)
            nodes += _conv(w, f"{name}.dw", f"{name}.project", f"{name}/project", hidden, out_channels, k=1,
                           relu=False)
            if repeat > 0 or (stride == 1 and channels == out_channels):
                nodes.append(helper.make_node("Add", [x, f"{name}.project"], [f"{name}.out"], name=f"{name}/add"))
                x = f"{name}.out"
            else:
                x = f"{name}.project"
            channels = out_channels
            index += 1
    nodes += _conv(w, x, "head", "head", channels, 1280, k=1)
    nodes.append(helper.make_node("GlobalAveragePool", ["head"], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["flat", w.uniform("fc.w", (classes, 1280), 1280),
                                           w.uniform("fc.b", (classes,), 1280)], ["logits"], transB=1, name="fc"))
    graph = helper.make_graph(nodes, "mobilenet_v2_like", [_vi("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [_vi("logits", TensorProto.FLOAT, [1, classes])], initializer=w.tensors)
    return make(graph)


def samples(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Image-like inputs: smooth fields plus noise, normalised as ImageNet's are."""
    rng = np.random.default_rng(seed)
    coarse = rng.standard_normal((count, 3, 7, 7)).astype(np.float32)
    smooth = coarse.repeat(32, axis=2).repeat(32, axis=3)
    return {"input": (smooth + 0.3 * rng.standard_normal((count, 3, 224, 224))).astype(np.float32)}


if __name__ == "__main__":
    folder = Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(mobilenet_v2(), str(folder / "mobilenet_v2.onnx"))
    np.savez(folder / "calib.npz", **samples(40))
