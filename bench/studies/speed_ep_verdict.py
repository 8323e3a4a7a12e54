"""issue 51 point 3: the time `quantize --static --ep qnn --auto` takes on a 224x224 MobileNetV2-like
model against one HTP-simulator pass over its evaluation samples (docs/decisions/speed-ep-verdict.md).

    PYTHONPATH=. .venv/bin/python -m bench.studies.speed_ep_verdict build OUT_DIR
    PYTHONPATH=. .venv/bin/python -m bench.studies.speed_ep_verdict pass MODEL.onnx OUT_DIR/calib.npz
    PYTHONPATH=. .venv/bin/python -m bench.studies.speed_ep_verdict ratio REPORT.json PASS_SECONDS

``pass``: one simulator pass (GateTarget.run, one session, nothing cached) over 8 of the samples,
the evaluation half's count, of MODEL (the A16W16 file: ``quantize M --static --ep qnn
--activation-type uint16 --weight-type int16 --gate-on-cpu --calib OUT_DIR/calib.npz
--keep-failed``); ``ratio``: a quantize report's (total - the quantizer's and engines' seconds) over
that pass, with its timing ledger.
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


def samples(count: int, seed: int = 0, classes: int = 10) -> dict[str, np.ndarray]:
    """Image-like inputs of ``classes`` kinds: a smooth field per kind plus its own smooth
    variation and noise, normalised as ImageNet's are."""
    rng = np.random.default_rng(seed)
    kinds = np.random.default_rng(99).standard_normal((classes, 3, 7, 7)).astype(np.float32)
    coarse = kinds[rng.integers(classes, size=count)] + 0.5 * rng.standard_normal((count, 3, 7, 7))
    smooth = coarse.repeat(32, axis=2).repeat(32, axis=3)
    return {"input": (smooth + 0.3 * rng.standard_normal((count, 3, 224, 224))).astype(np.float32)}


def trained_head(model: onnx.ModelProto, classes: int = 10, scale: float = 8.0) -> onnx.ModelProto:
    """The classifier with its last layer set as training would leave it on samples()'s kinds:
    each kind's row the direction of its mean pooled feature (from the rest), the others small,
    so that top-1 decisions have margins as a trained model's do."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(_vi("flat", TensorProto.FLOAT, [1, 1280]))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    features, labels = [], []
    for kind in range(classes):
        rng = np.random.default_rng(1000 + kind)
        base = np.random.default_rng(99).standard_normal((classes, 3, 7, 7)).astype(np.float32)[kind]
        for _ in range(4):
            coarse = base + 0.5 * rng.standard_normal((3, 7, 7))
            image = coarse.repeat(32, axis=1).repeat(32, axis=2) + 0.3 * rng.standard_normal((3, 224, 224))
            features.append(session.run(["flat"], {"input": image[None].astype(np.float32)})[0][0])
            labels.append(kind)
    features, labels = np.asarray(features), np.asarray(labels)
    centre = features.mean(axis=0)
    weights = {t.name: t for t in model.graph.initializer}
    fc = onnx.numpy_helper.to_array(weights["fc.w"]).copy()
    bias = np.zeros(fc.shape[0], np.float32)
    for kind in range(classes):
        direction = features[labels == kind].mean(axis=0) - centre
        fc[kind] = scale * direction / (np.linalg.norm(direction) ** 2 + 1e-12)
        bias[kind] = -float(fc[kind] @ centre)
    rest = (features - centre) @ fc[classes:].T  # the other classes' logits: spread 0.5, centred
    fc[classes:] *= 0.5 / (rest.std() + 1e-12)
    bias[classes:] = -(fc[classes:] @ centre)
    weights["fc.w"].CopyFrom(onnx.numpy_helper.from_array(fc.astype(np.float32), "fc.w"))
    weights["fc.b"].CopyFrom(onnx.numpy_helper.from_array(bias, "fc.b"))
    return model


def one_pass(model: Path, calib: Path, count: int = 8) -> float:
    """Seconds of one simulator pass of ``model`` over ``count`` samples of ``calib``: a QNN session
    (the HTP simulator, soc_model 60, as ortprep's default device) built and run on each sample, as
    quantize's gate runs a file on its worker."""
    import time

    import onnxruntime as ort
    import onnxruntime_qnn

    provider = "QNNExecutionProvider"
    with np.load(calib) as data:
        feeds = [{name: data[name][i:i + 1] for name in data.files} for i in range(count)]
    started = time.monotonic()
    try:
        ort.register_execution_provider_library(provider, onnxruntime_qnn.get_library_path())
    except Exception:  # noqa: BLE001 - registered already in this process
        pass
    options = ort.SessionOptions()
    options.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == provider],
                                     {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": "60"})
    session = ort.InferenceSession(str(model), sess_options=options)
    for feed in feeds:
        session.run(None, feed)
    return time.monotonic() - started


def ratio(report: Path, seconds: float) -> dict:
    import json

    timing = json.loads(report.read_text())["timing"]
    rest = timing["total_s"] - timing["quantizer_s"]
    return {"pass_s": round(seconds, 1), "ratio": round(rest / seconds, 2), **timing}


if __name__ == "__main__":
    if sys.argv[1] == "pass":
        print(f"pass: {one_pass(Path(sys.argv[2]), Path(sys.argv[3])):.1f} s")
        sys.exit()
    if sys.argv[1] == "ratio":
        print(ratio(Path(sys.argv[2]), float(sys.argv[3])))
        sys.exit()
    folder = Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    model = mobilenet_v2()
    onnx.save(model, str(folder / "mobilenet_v2.onnx"))
    onnx.save(trained_head(model), str(folder / "mobilenet_v2_head.onnx"))
    np.savez(folder / "calib.npz", **samples(40))
