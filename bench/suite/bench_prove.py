"""check --prove's reduction of a failing session to its culprits, and the fix search
(ortprep/prove/culprits.py), on the QNN HTP simulator for the Snapdragon 888 (soc_model 30), where
a depthwise Conv with strides [2, 1], a written-out LayerNorm (ReduceSum -> Mul), a HardSigmoid
gate and more fail at graph finalize (QNN_COMMON_ERROR_MEM_ALLOC).

Models: chains of Conv/Relu pairs with planted culprits (one, or two far apart); realistic
networks of 100-1,000 nodes with one planted pattern whose plain version the 888 creates (an OCR
direction classifier like PP-OCR's, a transformer encoder from tests/models.py with its LayerNorms
written out); real models from PyPI wheels with their shapes fixed (PP-OCR's classifier,
detector and recogniser from rapidocr, YOLOv8n from nudenet, magika).

Every session runs on a worker, as `check --prove` builds them: the failing session, each probe of
the reduction (bound: ortprep.prove's Budget, 100 sessions and 120 s), then the fix search twice:
in its default order (provider options, then a graph change) and with the device kept (no
soc_model or htp_arch: the graph change that keeps the culprits off the NPU, verified by its QNN
session and by its outputs on the CPU EP against the original's).
Run: .venv/bin/python -m bench.suite.bench_prove [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import OUT, models_from_wheels

DEVICE = "888"
WHEELS = {
    "rapidocr==3.10.0": {"rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx": "ocr_cls.onnx",
                         "rapidocr/models/PP-OCRv6_det_small.onnx": "ocr_det.onnx",
                         "rapidocr/models/PP-OCRv6_rec_small.onnx": "ocr_rec.onnx"},
    "nudenet==3.4.2": {"nudenet/320n.onnx": "yolov8n_320.onnx"},
    "magika==1.0.3": {"magika/models/standard_v3_3/model.onnx": "magika.onnx"},
}
# file -> (input name, static shape): the shapes the applications feed
FIXED = {"ocr_cls.onnx": ("x", "1,3,48,192"), "ocr_det.onnx": ("x", "1,3,320,320"), "ocr_rec.onnx": ("x", "1,3,48,320"),
         "yolov8n_320.onnx": ("images", "1,3,320,320"), "magika.onnx": ("bytes", "1,2048")}


# --------------------------------------------------------------------------- models


def chain(path: Path, nodes: int, plant: dict[float, str]) -> Path:
    """Conv/Relu pairs over 8 channels at 16x16 with patterns planted at a share of the node
    order: "dw" a depthwise Conv with strides [2, 1] (culprit_dw), "hs" a squeeze-excite gate whose
    HardSigmoid fails (culprit_hs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph_nodes, inits, current, height = [], [], "x", 16
    extra = sum(1 if kind == "dw" else 3 for kind in plant.values())
    pairs = (nodes - 1 - extra) // 2
    spots = {int(pairs * share): kind for share, kind in plant.items()}
    for index in range(pairs):
        inits.append(numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.3).astype(np.float32), f"w{index}"))
        graph_nodes.append(helper.make_node("Conv", [current, f"w{index}"], [f"c{index}"], name=f"conv{index}"))
        graph_nodes.append(helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}"))
        current = f"r{index}"
        kind = spots.get(index)
        if kind == "dw":
            inits.append(numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "dw_w"))
            graph_nodes.append(helper.make_node("Conv", [current, "dw_w"], ["dw_out"], group=8, strides=[2, 1],
                                                pads=[1, 1, 1, 1], name="culprit_dw"))
            current, height = "dw_out", height // 2
        elif kind == "hs":
            graph_nodes += [
                helper.make_node("GlobalAveragePool", [current], ["se_pool"], name="se_pool"),
                helper.make_node("HardSigmoid", ["se_pool"], ["se_gate"], alpha=0.2, beta=0.5, name="culprit_hs"),
                helper.make_node("Mul", [current, "se_gate"], ["se_out"], name="se_scale"),
            ]
            current = "se_out"
    graph_nodes.append(helper.make_node("Relu", [current], ["y"], name="out"))
    graph = helper.make_graph(
        graph_nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, height, 16])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def ocr_classifier(path: Path, blocks: int, plant: float | None = 0.5) -> Path:
    """An OCR direction classifier like PP-OCR's (MobileNetV3-style on a 1x3x48x192 text line):
    stem Conv with strides 2, inverted-residual blocks (1x1 expand, 3x3 depthwise, squeeze-excite
    with a Sigmoid gate, 1x1 project, residual Add), each Conv with BatchNormalization and Relu;
    GlobalAveragePool, Gemm, Softmax. ``plant``: at that share of the blocks one depthwise Conv
    has strides [2, 1] (planted_dw), as PP-OCR's have; None: none (the 888 creates that model)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    nodes, inits, counter = [], [], [0]

    def fresh(kind: str) -> str:
        counter[0] += 1
        return f"{kind}_{counter[0]}"

    def init(array) -> str:
        name = fresh("w")
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def conv(x, cin, cout, k=1, stride=(1, 1), group=1, bn=True, relu=True, name=None):
        weight = init(rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k)))
        out = fresh("conv")
        nodes.append(helper.make_node("Conv", [x, weight], [out], kernel_shape=[k, k], pads=[k // 2] * 4,
                                      strides=list(stride), group=group, name=name or out))
        if bn:
            normed = fresh("bn")
            nodes.append(helper.make_node("BatchNormalization", [out, init(rng.uniform(0.5, 1.5, cout)),
                                          init(rng.standard_normal(cout) * 0.1), init(rng.standard_normal(cout) * 0.1),
                                          init(rng.uniform(0.5, 1.5, cout))], [normed], name=normed))
            out = normed
        if relu:
            activated = fresh("relu")
            nodes.append(helper.make_node("Relu", [out], [activated], name=activated))
            out = activated
        return out

    widths = [16, 24, 24, 40, 40, 40, 48, 48, 96, 96, 96]
    x, channels = conv("x", 3, 16, 3, (2, 2)), 16
    planted = None if plant is None else int(blocks * plant)
    for index in range(blocks):
        out_channels = widths[min(index * len(widths) // blocks, len(widths) - 1)]
        stride = (2, 1) if index == planted else ((2, 2) if index in (1, blocks // 2) else (1, 1))
        hidden = channels * 3
        expanded = conv(x, channels, hidden)
        depthwise = conv(
            expanded, hidden, hidden, 3, stride, group=hidden, name="planted_dw" if index == planted else None
        )
        pool, gate, scaled = fresh("gap"), fresh("gate"), fresh("scaled")
        nodes.append(helper.make_node("GlobalAveragePool", [depthwise], [pool], name=pool))
        excite = conv(
            conv(pool, hidden, max(8, hidden // 4), bn=False), max(8, hidden // 4), hidden, bn=False, relu=False
        )
        nodes += [helper.make_node("Sigmoid", [excite], [gate], name=gate),
                  helper.make_node("Mul", [depthwise, gate], [scaled], name=scaled)]
        projected = conv(scaled, hidden, out_channels, relu=False)
        if out_channels == channels and stride == (1, 1):
            added = fresh("residual")
            nodes.append(helper.make_node("Add", [x, projected], [added], name=added))
            projected = added
        x, channels = projected, out_channels
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pooled"], name="head_pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node(
            "Gemm",
            ["flat", init(rng.standard_normal((2, channels)) * 0.1), init(np.zeros(2))],
            ["logits"],
            transB=1,
            name="fc",
        ),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "ocr_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 48, 192])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def encoder(path: Path, layers: int, plant: float | None = 0.5) -> Path:
    """tests/models.py's vit_like encoder with its LayerNorms written out (ReduceMean, Sub, ...);
    ``plant``: one layer's first norm written instead as jax2tf writes LayerNorm (magika's model):
    E[x] and E[x^2] as ReduceSum * 1/N, then rsqrt (the nodes named planted_*). None: as built
    (the 888 creates that model)."""
    import onnx
    from onnx import helper, numpy_helper

    from bench.paths import test_models

    models = test_models()

    model = models.vit_like(layers=layers, decomposed_norm=True)
    if plant is not None:
        prefix = f"l{int(layers * plant)}/ln1"
        graph, nodes = model.graph, list(model.graph.node)
        first = next(k for k, n in enumerate(nodes) if n.name == f"{prefix}/mean")
        last = next(k for k, n in enumerate(nodes) if n.name == f"{prefix}/shift")
        source, out = nodes[first].input[0], nodes[last].output[0]
        weight, bias = nodes[last - 1].input[1], nodes[last].input[1]
        graph.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), "planted_axes"),
                                  numpy_helper.from_array(np.array(1.0 / 64, np.float32), "planted_inv"),
                                  numpy_helper.from_array(np.array(1e-5, np.float32), "planted_eps")])
        make = helper.make_node
        nodes[first:last + 1] = [
            make("ReduceSum", [source, "planted_axes"], ["p_sum"], keepdims=1, name="planted_sum"),
            make("Mul", ["p_sum", "planted_inv"], ["p_mean"], name="planted_mean"),
            make("Mul", [source, source], ["p_sq"], name="planted_square"),
            make("ReduceSum", ["p_sq", "planted_axes"], ["p_sum2"], keepdims=1, name="planted_sum2"),
            make("Mul", ["p_sum2", "planted_inv"], ["p_ex2"], name="planted_ex2"),
            make("Mul", ["p_mean", "p_mean"], ["p_m2"], name="planted_mean2"),
            make("Sub", ["p_ex2", "p_m2"], ["p_var"], name="planted_var"),
            make("Add", ["p_var", "planted_eps"], ["p_ve"], name="planted_add_eps"),
            make("Sqrt", ["p_ve"], ["p_sd"], name="planted_sqrt"),
            make("Reciprocal", ["p_sd"], ["p_rstd"], name="planted_rstd"),
            make("Sub", [source, "p_mean"], ["p_d"], name="planted_center"),
            make("Mul", ["p_d", "p_rstd"], ["p_n"], name="planted_normalize"),
            make("Mul", ["p_n", weight], ["p_nw"], name="planted_scale"),
            make("Add", ["p_nw", bias], [out], name="planted_shift")]
        del graph.node[:]
        graph.node.extend(nodes)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def real_models(folder: Path) -> list[tuple[str, Path]]:
    """The wheels' models with static input shapes (ortprep convert --fix-shape)."""
    extracted = models_from_wheels(OUT / "wheels", WHEELS, folder / "wheels")
    found = []
    for path in extracted:
        name, shape = FIXED[path.name]
        fixed = folder / f"{path.stem}.fixed.onnx"
        if not fixed.exists():
            subprocess.run([sys.executable, "-m", "ortprep", "convert", str(path), "--fix-shape", f"{name}={shape}",
                            "-o", str(fixed)], check=True, capture_output=True)
        found.append((path.stem, fixed))
    order = ["ocr_cls", "ocr_det", "ocr_rec", "yolov8n_320", "magika"]
    return sorted(found, key=lambda item: order.index(item[0]))


def built_models(folder: Path) -> list[tuple[str, Path]]:
    """The journey corpus's recurrent and transformer models (bench/suite/journey_corpus.py), built and
    given the static shapes a deployment gives them (ortprep convert --fix-shape)."""
    import onnx

    from bench.suite import journey_corpus

    cases = {case.name: case for case in journey_corpus.CORPUS}
    found = []
    for name in ("lstm_keywords", "gru_tagger", "bert_tiny", "gpt2_tiny"):
        path = folder / f"{name}.onnx"
        onnx.save(journey_corpus.BUILDERS[name](), str(path))
        fixed = folder / f"{name}.fixed.onnx"
        shapes = [f"--fix-shape={key}={','.join(map(str, dims))}" for key, dims in cases[name].static.items()]
        subprocess.run([sys.executable, "-m", "ortprep", "convert", str(path), *shapes, "-o", str(fixed)], check=True,
                       capture_output=True)
        found.append((name, fixed))
    return found


# --------------------------------------------------------------------------- measuring


class Qnn:
    """QNN sessions for the 888 on workers, as check --prove builds them."""

    def __init__(self) -> None:
        from ortprep import ep_runtime, resolve_ep, session_caller, session_options

        self.spec = resolve_ep("qnn")
        self.target = ep_runtime(self.spec)
        self.options = session_options(self.target, None, DEVICE)
        self._session = session_caller(self.spec, self.target, 300)

    def session(self, path: str, options: dict[str, str] | None = None):
        return self._session(path, self.options if options is None else options)

    def fails(self, path: str) -> tuple[bool, str]:
        created, message, _ = self.session(path)
        return not created, message


def measure(qnn: Qnn, name: str, path: Path, planted: list[str], workdir: Path) -> dict:
    import onnx

    from ortprep import ModelHandle, find_fix, reduce_failure, workers_scope

    nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
    with workers_scope():
        started = time.perf_counter()
        created, message, _ = qnn.session(str(path))
        bare = time.perf_counter() - started
        row = {"model": name, "nodes": nodes, "bare": bare, "created": created}
        if created:
            return row
        handle = ModelHandle.open(path)
        culprit = reduce_failure(handle, qnn.fails, message=message)
        named = [group["nodes"] for group in culprit["culprits"]]
        row.update(culprit=culprit, named=named,
                   planted_found=all(any(name.startswith(p) for group in named for name in group) for p in planted))
        common = dict(provider=qnn.spec.provider, provider_options=qnn.options, ep_label="qnn",
                      workdir=workdir / name, command_args=["--device", DEVICE])
        row["fix"] = find_fix(handle, culprit, qnn.session, **common)
        row["graph_fix"] = find_fix(handle, culprit, qnn.session, keep_device=True, **common)
    return row


def _sets(named: list[list[str]], limit: int = 3) -> str:
    shown = ["{" + ", ".join(group) + "}" if len(group) > 1 else group[0] for group in named[:limit]]
    more = f" +{len(named) - limit} more" if len(named) > limit else ""
    return "; ".join(shown) + more if named else "none"


def _fix(fix: dict) -> str:
    if fix["kind"] == "provider_option":
        return ", ".join(f"{k}={v}" for k, v in fix["options"].items())
    if fix["kind"] == "graph":
        placement = fix.get("placement") or {}
        kept, pruned = fix["kept_off"], fix.get("pruned", [])
        return (f"{len(kept)} of {len(kept) + len(pruned)} culprit sets kept off the NPU ({', '.join(kept[:2])}"
                f"{', ...' if len(kept) > 2 else ''}); {placement.get('nodes_on_ep')}/{placement.get('nodes_total')} "
                "nodes on QNN")
    return "none" + (" (bound reached)" if "stopped" in fix else "")


def main() -> None:
    quick = "--quick" in sys.argv
    qnn = Qnn()
    with tempfile.TemporaryDirectory(prefix="bench-prove-") as tmp:
        folder = Path(tmp)
        cases: list[tuple[str, Path, list[str]]] = []
        for nodes, plant in ((100, {0.5: "dw"}), (300, {0.5: "dw"}), (1000, {0.5: "dw"}), (1000, {0.9: "dw"}),
                             (300, {0.1: "dw", 0.9: "hs"})):
            if quick and nodes == 1000:
                continue
            label = f"chain {nodes}, " + " + ".join(f"{kind} at {share:.0%}" for share, kind in plant.items())
            path = chain(folder / f"chain{nodes}_{len(cases)}.onnx", nodes, plant)
            cases.append((label, path, [f"culprit_{kind}" for kind in plant.values()]))
        for blocks in ((24,) if quick else (24, 60)):
            cases.append((f"OCR classifier-like, {blocks} blocks", ocr_classifier(folder / f"cls{blocks}.onnx", blocks),
                          ["planted_dw"]))
        for layers in ((10,) if quick else (10, 28)):
            cases.append((f"encoder, {layers} layers", encoder(folder / f"enc{layers}.onnx", layers), ["planted_"]))
        if not quick:
            cases += [(f"{name} (wheel)", path, []) for name, path in real_models(OUT / "prove-models")]
            cases += [(f"{name} (built)", path, []) for name, path in built_models(folder)]
        # the plain versions of the realistic networks are created on the 888: their plants are the only culprits
        controls = [
            ocr_classifier(folder / "cls_plain.onnx", 24, plant=None),
            encoder(folder / "enc_plain.onnx", 10, plant=None),
        ]
        from ortprep import workers_scope

        with workers_scope():
            plain = [qnn.session(str(path))[0] for path in controls]
        rows = [measure(qnn, label, path, planted, folder) for label, path, planted in cases]

    print(f"\nControls: the realistic networks without their plant, on the 888: "
          f"{'created' if all(plain) else 'NOT created'} ({', '.join(str(p) for p in plain)}).")
    print("\n| model | nodes | units | bare session (s) | culprit sets | named (first 3) | planted named | probes | "
          "reduction (s) |\n|---|---:|---:|---:|---:|---|---|---:|---:|")
    for row in rows:
        if row["created"]:
            print(f"| {row['model']} | {row['nodes']} | | {row['bare']:.2f} | created | | | | |")
            continue
        culprit = row["culprit"]
        planted = "yes" if row["planted_found"] else "no"
        stopped = " (bound)" if "stopped" in culprit else ""
        print(
            f"| {row['model']} | {row['nodes']} | {culprit['units']} | {row['bare']:.2f} | "
            f"{len(row['named'])}{stopped} | "
            f"{_sets(row['named'])} | {planted if row['model'].endswith(('(wheel)', '(built)')) is False else '-'} | "
            f"{culprit['probes']} | "
            f"{culprit['seconds']:.1f} |"
        )
    print("\n| model | fix (default order) | sessions | s | graph fix (device kept), pruned in the whole model | "
          "sessions | s | CPU max abs diff (opt. off / default) |\n|---|---|---:|---:|---|---:|---:|---|")
    for row in rows:
        if row["created"]:
            continue
        fix, graph = row["fix"], row["graph_fix"]
        verified = graph.get("verified") or {}
        diff = (f"{verified['max_abs_diff']:.1e} / {verified['max_abs_diff_default']:.1e}" if verified else "-")
        print(f"| {row['model']} | {_fix(fix)} | {fix['sessions']} | {fix['seconds']:.1f} | {_fix(graph)} | "
              f"{graph['sessions']} | {graph['seconds']:.1f} | {diff} |")


if __name__ == "__main__":
    main()
