"""What a quantized graph says about itself, on ONNX protos only (no runs).

Which ops are quantized and how much of the weights, which nodes keep float weights, which
MatMuls the CPU EP computes in int8, which nodes write an output, and a model with chosen
intermediates exposed as outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ortprep.model import iter_graphs
from ortprep.fidelity.graph import RANGE_KEEPING as PASS_THROUGH

QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul", "QGemm", "QAttention",
                 "DynamicQuantizeMatMul",
                 "MatMulNBits", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearConcat"}
# weight-only ops: their weights are block-quantized, their activations float (quantize --weight-only)
BLOCK_QUANTIZED_OPS = ("MatMulNBits", "GatherBlockQuantized", "MatMulBnb4")
INT_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4)


def with_outputs(model: Path, names: list[str]) -> Path:
    """A copy of ``model`` beside it with ``names`` added as outputs. Only the graph is read:
    external weights stay where they are (the copy points at the same data file)."""
    proto = onnx.load(str(model), load_external_data=False)
    present = {v.name for v in proto.graph.output}
    produced = {o for n in proto.graph.node for o in n.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present and n in produced)
    path = model.parent / (model.stem + ".exposed.onnx")
    onnx.save_model(proto, str(path))
    return path


def float_weighted(proto: ModelProto) -> tuple[list[str], int]:
    """(the top-level MatMul/Gemm/Conv nodes whose weight is still a float initializer, how many such
    nodes have a weight at all): where most of a model's weights stayed float, the file is a float
    model with a few Q/DQ pairs."""
    inits = {t.name: t for t in proto.graph.initializer}
    dq_outputs = {out for node in proto.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    float_nodes, weighted = [], 0
    for node in proto.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv", "ConvTranspose") or len(node.input) < 2:
            continue
        weight = node.input[1]
        if weight in dq_outputs:
            weighted += 1
        elif weight in inits and inits[weight].data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            weighted += 1
            float_nodes.append(node.name or node.output[0])
    return float_nodes, weighted


def quantization_stats(proto: ModelProto) -> dict[str, int]:
    """Ops computed on quantized data, and quantized weights, over all graphs."""
    dq_outputs = set()
    ops = weights = 0
    nodes = [n for _, g in iter_graphs(proto.graph) for n in g.node]
    for node in nodes:
        if node.op_type == "DequantizeLinear":
            dq_outputs.update(node.output)
    for node in nodes:
        if node.op_type in QUANT_OPS:
            continue
        if (node.op_type.startswith("QLinear") or node.op_type.endswith("Integer")
            or node.op_type in BLOCK_QUANTIZED_OPS
                or any(i in dq_outputs for i in node.input)):
            ops += 1
    integer_elements = float_elements = 0
    for _, graph in iter_graphs(proto.graph):
        integers = [t for t in graph.initializer if t.data_type in INTEGER_WEIGHT_TYPES and len(t.dims) >= 1
                    and np.prod(t.dims) > 1]
        weights += len(integers)
        integer_elements += sum(int(np.prod(t.dims)) for t in integers)
        floats = {t.name: int(np.prod(t.dims)) for t in graph.initializer
                  if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)}
        read = {node.input[1] for node in graph.node if node.op_type in WEIGHT_READERS and len(node.input) > 1}
        read |= {node.input[0] for node in graph.node if node.op_type == "Gather" and node.input}
        float_elements += sum(count for name, count in floats.items() if name in read)
    total = integer_elements + float_elements
    return {"quantized_ops": ops, "quantized_weights": weights,
            # of the weight elements (integer initializers, and float ones a Conv/MatMul/Gemm/... or a
            # Gather table reads), the share stored as integers: what --auto-exclude's float nodes cost
            "quantized_weight_share": round(integer_elements / total, 4) if total else None}


INTEGER_WEIGHT_TYPES = INT_TYPES + (TensorProto.INT16, TensorProto.UINT16)
WEIGHT_READERS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention")


def int8_compute_matmuls(proto: ModelProto) -> list[str]:
    """The MatMul/Gemm nodes (top graph; a Gemm without transposes) that read a 16-bit activation
    through a DequantizeLinear and an 8- or 4-bit constant weight through another: ORT's CPU EP
    (its default session) fuses each DequantizeLinear(weight) + MatMul into MatMulNBits at accuracy
    level 4 (``session.qdq_matmulnbits_accuracy_level``, default 4: onnxruntime's session options
    header, DQMatMulToMatMulNBitsSelector), which quantizes the activation to int8 per block of 32
    at run time (docs/decisions/reduce-quantize-measurements.md)."""
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}

    def dq_width(name: str) -> int | None:
        node = producers.get(name)
        if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 3 or node.input[2] not in inits:
            return None
        return inits[node.input[2]].data_type

    found = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Gemm" and (attributes.get("transA", 0) or attributes.get("transB", 0)):
            continue  # measured (onnxruntime 1.32.0): a Gemm with transB=1 (PyTorch's Linear) is not fused
        weight = producers.get(node.input[1])
        if (dq_width(node.input[0]) in (TensorProto.UINT16, TensorProto.INT16) and weight is not None
                and weight.op_type == "DequantizeLinear" and weight.input[0] in inits
                and inits[weight.input[0]].data_type in INT_TYPES):
            found.append(node.name or node.output[0])
    return found


def output_writers(quant_proto: ModelProto, outputs: list[str]) -> tuple[list[str], list[str]]:
    """For ``outputs`` of a quantized model: the first node on the way back from each that computes
    on quantized data (a QOperator op, or a QDQ node unit: DequantizeLinear in, QuantizeLinear out),
    past the Q/DQ pairs, ops that only move values and float nodes; and the float nodes passed on
    the way (an EP computes them in its own float precision). Where an EP's own encoding or
    precision meets the output."""
    graph = quant_proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    dequantized = {node.output[0] for node in graph.node if node.op_type == "DequantizeLinear" and node.output}
    requantized = {node.input[0] for node in graph.node if node.op_type == "QuantizeLinear" and node.input}
    quantized_nodes: list[str] = []
    float_nodes: list[str] = []
    for name in outputs:
        queue, seen = [name], set()
        while queue and len(seen) <= 32:
            node = producers.get(queue.pop(0))
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            quantized = node.op_type not in QUANT_OPS and (node.op_type in QUANTIZED_OPS or (
                any(i in dequantized for i in node.input) and any(o in requantized for o in node.output)))
            if quantized and node.op_type not in PASS_THROUGH:
                if node.name not in quantized_nodes:
                    quantized_nodes.append(node.name)
                continue
            if not quantized and node.op_type not in QUANT_OPS and node.op_type not in PASS_THROUGH \
                    and node.name not in float_nodes:
                float_nodes.append(node.name)
            queue.extend(i for i in node.input if i in producers)
    return quantized_nodes, float_nodes
