"""A model made ready for one quantize attempt: the refusals before any work (already quantized,
nothing to quantize), then the graph ORT's quantizer gets (Constant weights to initializers, node
names, the folds QNN's HTP needs, sentinel readers kept float, the opset per-channel QDQ needs)
written to the attempt's folder, pre-processed beside it where asked. The graph work itself is
:mod:`ortprep.transforms.qdq.prepare`; this module decides and reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.findings import Finding
from ortprep.model import ModelHandle, iter_graphs
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.steps.quantize.calibrate import preprocess
from ortprep.steps.quantize.evaluate import opset_upgrade_verified
from ortprep.transforms.fp16 import ensure_node_names
from ortprep.transforms.qdq.prepare import (
    already_quantized,
    constants_to_initializers,
    fold_batch_norms,
    fold_conv_transpose_bias,
    name_nodes,
    sentinel_readers,
    upgrade_opset,
)
from ortprep.transforms.verify import save_temp


def legal_settings(proto: ModelProto, settings: dict, feeds: dict[str, np.ndarray] | None, report: StepResult
                   ) -> tuple[ModelProto, dict]:
    """Per-channel QDQ writes DequantizeLinear with an axis, which needs opset 13: upgrade the
    opset (verified) or fall back to per-tensor, and say which."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    if not (settings["per_channel"] and settings["format"] == "qdq" and opset < 13):
        return proto, settings
    upgraded = upgrade_opset(proto, 13)
    if upgraded is not None and feeds is not None:
        check = opset_upgrade_verified(proto, upgraded, feeds)
        if check.passed:
            report.add(Finding.of("QNT012",
                                  f"per-channel QDQ needs opset 13 (DequantizeLinear's axis); the model's opset "
                                  f"{opset} was upgraded to 13 and verified (max abs diff {_diff(check.max_abs_diff)})",
                                  fix="nothing to do; --per-tensor keeps the opset"))
            return upgraded, settings
    report.add(Finding.of("QNT012",
                          f"per-channel QDQ needs opset 13 (DequantizeLinear's axis) and the model's opset {opset} "
                          "could not be upgraded with verification: weights are quantized per tensor",
                          fix="upgrade it yourself (ortprep convert --opset 13) to get per-channel weights"))
    return proto, {**settings, "per_channel": False}


def _diff(value: float | None) -> str:
    return "not numeric" if value is None else f"{value:.3g}"


# Ops of ORT's quantizer registries that only move or select data: a model of these alone has
# nothing whose arithmetic int8 would make cheaper.
_DATA_MOVEMENT = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split", "Pad", "Concat", "Where",
                  "TopK", "Gather", "GatherElements", "ArgMax"}


def nothing_to_quantize(proto: ModelProto) -> str | None:
    """Why the model has nothing ORT's quantizer computes on (its registries: dynamic, QDQ and
    QOperator), or None. An ai.onnx.ml pipeline (a scikit-learn export: Scaler, LinearClassifier,
    ZipMap) made ORT's quantizer fail inside ("Failed to find proper ai.onnx domain", QNT008)."""
    from ortprep.runtime.quantizer_ops import all_registry_op_types

    quantizable = all_registry_op_types() - _DATA_MOVEMENT
    ops: dict[str, int] = {}
    for _, graph in iter_graphs(proto.graph):
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
            ops[key] = ops.get(key, 0) + 1
    if any(op in quantizable for op in ops):
        return None
    shown = ", ".join(f"{op} x{count}" if count > 1 else op for op,
                      count in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
    return f"none of its ops ({shown or 'no nodes'}) is one ONNX Runtime's quantizer computes on in int8"


def matmulnbits_on(ep: str, report: StepResult) -> None:
    """QNT018 when the target EP's table has no MatMulNBits kernel: the rewritten MatMuls would run
    on the CPU EP beside it (the EP's tables: ortprep/eps/data)."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.kernels import support_table

    name = resolve_ep(ep).name
    if support_table(name).lookup("com.microsoft", "MatMulNBits"):
        return
    report.add(Finding.of("QNT018", f"{name} has no MatMulNBits kernel in its operator table: the weight-only MatMuls "
                          f"would run on the CPU EP, beside {name}", ep=name,
                          fix=f"for {name}, --static (QDQ) keeps MatMuls on the EP; weight-only suits the CPU, CUDA, "
                              "DirectML and WebGPU EPs"))


def no_matmul_weights(proto: ModelProto) -> str | None:
    """Why weight-only quantization has nothing to work on (MatMulNBits takes a MatMul whose second
    input is a constant 2-D weight), or None."""
    weights = {t.name: t for t in proto.graph.initializer}
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]
    if any(len(n.input) > 1 and n.input[1] in weights and len(weights[n.input[1]].dims) == 2 for n in matmuls):
        return None
    if not matmuls:
        return "the model has no MatMul (weight-only quantization rewrites MatMuls with constant 2-D weights)"
    return (f"none of its {len(matmuls)} MatMul(s) has a constant 2-D weight as its second input (a Gemm, a Conv or a "
            "MatMul of two computed tensors is not what MatMulNBits takes)")


def refused(handle: ModelHandle, options: QuantizeOptions, report: StepResult) -> bool:
    """Whether the model is refused before any work (QNT010: already quantized; QNT002: nothing
    to quantize); adds QNT018 where weight-only MatMuls would leave the target EP."""
    already = already_quantized(handle.proto)
    if already is not None:
        report.add(Finding.of("QNT010", f"the model is already quantized ({already}); quantizing it again would stack "
                              "a second quantization on the first", fix="quantize the float model it was made from"))
        return True
    weight_only = options.mode == "weight-only"
    nothing = no_matmul_weights(handle.proto) if weight_only else nothing_to_quantize(handle.proto)
    if weight_only and nothing is None and "MatMul" in options.exclude_ops:
        # ORT's weight-only quantizer reads an empty op list as its default, MatMul: said, not done
        nothing = "--exclude-op MatMul leaves weight-only quantization no MatMul to rewrite"
    if nothing is not None:
        fix = ("weight-only quantization is for MatMul weights (transformers); a CNN: --static or --dynamic"
               if weight_only else "nothing to do: the model stays as it is (for an ai.onnx.ml pipeline, convert its "
               "estimator to ONNX ops first)")
        report.add(Finding.of("QNT002", f"nothing to quantize: {nothing}", fix=fix))
        return True
    if weight_only:
        matmulnbits_on(options.ep, report)
    return False


@dataclass
class Prepared:
    """The float model as ORT's quantizer gets it, in the attempt's folder."""

    float_path: Path  # the model as given, prepared (what the result is compared with)
    sources: list[tuple[str, Path]]  # (label, file): pre-processed first where it is checked, then as given
    settings: dict  # per_channel dropped where the opset could not be upgraded
    sentinels: list[str]  # nodes kept float: they read a sentinel constant
    folded: list[str]  # ConvTranspose bias Adds folded (QNN)
    folded_norms: list[str]  # BatchNormalizations folded into their Conv (QNN)
    preprocess_detail: str
    big: bool  # the model has external data


# what QNT025 and QNT026 say of the folds
FOLD_WORDS = {
    "QNT025": "Add(s) of a constant per channel after a ConvTranspose were folded into its bias (the same function in "
              "float): QNN's HTP computes such an Add wrongly once quantized (measured: 6.5% of the output's range "
              "off, where the ConvTranspose with the bias folded in agrees within 0.02%)",
    "QNT026": "BatchNormalization(s) after a Conv were folded into its weights and bias (the same function in float): "
              "QNN's HTP computes a BatchNormalization quantized on its own wrongly (measured: up to half of the "
              "output's range off, cosine 0.975, in A16W16 and A8W8)",
}


def prepare(handle: ModelHandle, options: QuantizeOptions, settings: dict, eval_feeds: list, workdir: Path,
            report: StepResult) -> Prepared:
    """The graph ORT's quantizer gets, saved in ``workdir`` (and pre-processed beside it where
    asked); findings QNT009, QNT025, QNT026, QNT015, QNT012."""
    proto = onnx.ModelProto()
    proto.CopyFrom(handle.proto)
    moved = constants_to_initializers(proto)
    if moved:
        report.add(Finding.of("QNT009", f"{moved} weight(s) held in Constant nodes became initializers so they can be "
                              "quantized", fix="nothing to do"))
    ensure_node_names(proto)
    folded, folded_norms = [], []
    if settings.get("preset") == "qnn" and options.mode == "static":
        # QNN's HTP computes a quantized ConvTranspose's bias Add, and a quantized
        # BatchNormalization, wrongly (eps/htp.py)
        folded = fold_conv_transpose_bias(proto, keep=set(options.exclude_nodes))
        folded_norms = fold_batch_norms(proto, keep=set(options.exclude_nodes))
    for code, names in (("QNT025", folded), ("QNT026", folded_norms)):
        if names:
            report.add(Finding.of(code, f"{len(names)} {FOLD_WORDS[code]}: " + ", ".join(names[:4])
                                  + (", ..." if len(names) > 4 else ""), fix="nothing to do"))
    sentinels = sentinel_readers(proto)
    if sentinels:
        report.add(Finding.of("QNT015", f"{len(sentinels)} node(s) read a non-finite or sentinel constant (such as the "
                              "-inf of a safe maximum) that no 8-bit range can hold; they stay float: "
                              + ", ".join(sentinels[:6]), fix="nothing to do"))
    proto, settings = legal_settings(proto, settings, eval_feeds[0] if eval_feeds else None, report)
    big = handle.has_external_data()
    float_path = save_temp(proto, workdir, "float.onnx")
    del proto
    preprocess_detail = "skipped (--no-preprocess)"
    sources = [("as given", float_path)]
    if options.mode == "weight-only":
        preprocess_detail = "not run: weight-only quantization changes MatMul weights alone"
    elif options.preprocess:
        preprocessed, preprocess_detail = preprocess(workdir, float_path, report)
        if preprocessed != float_path:
            name_nodes(preprocessed)
            # checked, not trusted: both are quantized and evaluated when there is data to judge by
            sources = [("preprocessed", preprocessed)] + (sources if eval_feeds else [])
    return Prepared(float_path, sources, settings, sentinels, folded, folded_norms, preprocess_detail, big)
