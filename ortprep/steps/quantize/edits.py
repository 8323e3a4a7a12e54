"""Graph work of quantize, on ONNX protos only (no runs, no processes): the edits it makes to a
model before and around the quantizer (Constant weights to initializers, node names, exposed
intermediates, the opset upgrade per-channel QDQ needs) and what it reads off a graph (nodes that
must stay float because they read a sentinel constant, whether a model is already quantized, what
the quantizer quantized, which nodes write an output).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ortprep.eps.htp import (
    HTP_MIN_MULTIPLIER,
    HTP_MULTIPLIER_FLOOR,
    WEIGHTED_OPS,
    sixteen_bit_activation_matmuls,
    weight_multipliers,
)
from ortprep.errors import UsageError
from ortprep.graphops import fresh_name
from ortprep.model import iter_graphs
from ortprep.runtime.compare import PASS_THROUGH
from ortprep.transforms.fp16 import ensure_node_names

QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul", "QGemm", "QAttention", "DynamicQuantizeMatMul",
                 "MatMulNBits", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearConcat"}
# weight-only ops: their weights are block-quantized, their activations float (quantize --weight-only)
BLOCK_QUANTIZED_OPS = ("MatMulNBits", "GatherBlockQuantized", "MatMulBnb4")
INT_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4)
SENTINEL = 1e30  # a constant at least this large is a stand-in for infinity, not a value


def constants_to_initializers(proto: ModelProto) -> int:
    """Weights held in Constant nodes become initializers (ORT's quantizer wants initializers)."""
    moved = 0
    for _, graph in iter_graphs(proto.graph):
        keep = []
        for node in graph.node:
            value = next((a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None and len(node.attribute) == 1:
                tensor = TensorProto()
                tensor.CopyFrom(value.t)
                tensor.name = node.output[0]
                graph.initializer.append(tensor)
                moved += 1
            else:
                keep.append(node)
        if len(keep) != len(graph.node):
            del graph.node[:]
            graph.node.extend(keep)
    return moved


def name_nodes(path: Path) -> None:
    """ORT's pre-processing leaves the nodes it creates unnamed: name them (OP_INDEX) in place."""
    model = onnx.load(str(path), load_external_data=False)
    if all(node.name for _, g in iter_graphs(model.graph) for node in g.node):
        return
    ensure_node_names(model)
    onnx.save_model(model, str(path))


def sentinel_readers(proto: ModelProto) -> list[str]:
    """Nodes of the main graph that read a float constant holding inf, NaN or a sentinel magnitude:
    quantizing their inputs would stretch an 8-bit range over it and erase every real value."""
    bad = set()
    for tensor in proto.graph.initializer:
        if tensor.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE) and int(np.prod(tensor.dims)) <= 1 << 20:
            values = onnx.numpy_helper.to_array(tensor)
            if values.size and (not np.all(np.isfinite(values)) or float(np.abs(values).max()) >= SENTINEL):
                bad.add(tensor.name)
    return [node.name for node in proto.graph.node if bad & set(node.input)]


def upgrade_opset(proto: ModelProto, version: int) -> ModelProto | None:
    """A copy of ``proto`` converted to default-domain opset ``version``, or None when it cannot be
    converted (per-channel QDQ writes DequantizeLinear with an axis, which needs opset 13)."""
    from ortprep.transforms import rewrites

    try:
        return rewrites.convert_opset(proto, version)
    except UsageError:
        return None


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


def already_quantized(proto: ModelProto) -> str | None:
    """What shows that a model is already quantized (QDQ or QOperator nodes), or None."""
    ops: dict[str, int] = {}
    for _, graph in iter_graphs(proto.graph):
        for node in graph.node:
            if node.op_type in QUANTIZED_OPS:
                ops[node.op_type] = ops.get(node.op_type, 0) + 1
    if not ops:
        return None
    weights = sum(1 for _, g in iter_graphs(proto.graph) for t in g.initializer if t.data_type in INT_TYPES and len(t.dims) >= 1
                  and int(np.prod(t.dims)) > 1)
    listed = ", ".join(f"{count} {op}" for op, count in sorted(ops.items(), key=lambda kv: -kv[1])[:5])
    return f"{listed}; {weights} 8-bit (or smaller) integer weight tensor(s)"


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
        if (node.op_type.startswith("QLinear") or node.op_type.endswith("Integer") or node.op_type in BLOCK_QUANTIZED_OPS
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
    level 4
    (``session.qdq_matmulnbits_accuracy_level``, default 4: onnxruntime's session options header,
    DQMatMulToMatMulNBitsSelector), which quantizes the activation to int8 per block of 32 at run
    time. Measured with onnxruntime 1.32.0: a 16-bit activation with one channel at 2000 beside values
    near 1, read by a MatMul, cosine 0.70 against float; 0.9999 with the option at 1 (float compute)
    or with optimizations off."""
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


# Ops whose output range is known whatever the input (QNN fixes their 16-bit encodings too):
# their calibrated range needs no headroom.
BOUNDED_OUTPUT_OPS = ("Sigmoid", "Tanh", "Softmax", "LogSoftmax", "HardSigmoid")
OUTPUT_HEADROOM_16 = 2.0  # 16-bit activation encodings are widened this much (1 bit of 16)


# Ops that move values without computing new ones: a QDQ model's tensors through them share one
# encoding (the EP requires it: QNN's Transpose, Reshape); looked through for the op that computes one.
_MOVES = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def _widened(step: float, point: float, dtype, factor: float) -> tuple[float, int]:
    """A 16-bit encoding (step, zero point) widened ``factor`` times: about its centre, but a
    bound at 0 stays at 0 (a range [0, high] also clamps what is below 0: it carries the ReLU that
    ORT's quantizer removed; widened about its centre it would let negative values through)."""
    info = np.iinfo(dtype)
    low, high = (info.min - point) * step, (info.max - point) * step
    width = (high - low) * factor
    if point <= info.min:  # low at 0
        low, high = 0.0, width
    elif point >= info.max:  # high at 0
        low, high = -width, 0.0
    else:
        centre = (low + high) / 2
        low, high = centre - width / 2, centre + width / 2
    new_step = width / (info.max - info.min)
    return new_step, int(np.clip(np.round(info.min - low / new_step), info.min, info.max))


def widen_activation_encodings(path: Path, factor: float = OUTPUT_HEADROOM_16, float_model: Path | None = None
                               ) -> tuple[list[str], list[str]]:
    """Widen every 16-bit activation encoding of a QDQ model by ``factor`` (_widened: about its
    centre, a bound at 0 kept), in place, and re-encode the int32 biases quantized with the scales
    that changed. Returns (the tensors widened: the inputs of their QuantizeLinear nodes, the graph
    outputs among what they write). The model's external weights are not read.

    A range calibrated on a few samples is the range of those samples, inside the model as at its
    outputs: an unseen input whose values reach past it is clipped. Measured on the NPU journey:
    a keyword spotter's logits calibrated to [-0.32, 0.41] on 16 samples, an unseen sample at
    -0.48, norm 0.97 on the CPU EP and on QNN; the control-flow classifier (A16W16), one of 8 unseen
    images pooled to 11.9 where the calibration samples had set 10.65, its logits at cosine 0.968
    and norm 0.944 while every held-back and calibration sample was at 0.99999 (1.0000 and 1.0006
    widened). A 16-bit grid affords the headroom: doubling a range costs one bit of sixteen.

    Each encoding is a pair of initializers (scale, zero point) that Q/DQ nodes share; a pair is
    widened once, for every node that reads it, so encodings that an EP requires equal (a tensor
    moved by a Reshape, a Flatten: the journey's dddd_det map, made by a Conv, then Transposed and
    Reshaped) stay equal. Left as they are: encodings of bounded ops' outputs (BOUNDED_OUTPUT_OPS:
    QNN fixes those), pairs any other op reads, per-channel or 8-bit ones, weights (Q/DQ of stored
    integers), a scale or zero point two pairs share, and the encoding of a tensor that a Clip made
    in the float model (``float_model``) and no longer makes (ORT's quantizer folded it: the range
    is its bounds). A bias stored as int32 with scale = input scale x weight scale gets the new
    scales and its integers rounded again from the float values they held."""
    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    qdq = ("QuantizeLinear", "DequantizeLinear")
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    made_by: dict[str, str] = {}
    if float_model is not None:
        made_by = {out: node.op_type for node in onnx.load(str(float_model), load_external_data=False).graph.node
                   for out in node.output}

    def folded_clip(name: str) -> bool:
        """A Clip made ``name`` in the float model and the QDQ model's range now clamps for it."""
        maker = producers.get(name)
        return made_by.get(name) == "Clip" and (maker is None or maker.op_type != "Clip")

    def origin(name: str):
        """The op that computes ``name``, looking back through Q/DQ pairs and value moves."""
        seen = 0
        while name in producers and seen < 32:
            node = producers[name]
            if node.op_type not in qdq and node.op_type not in _MOVES:
                return node
            name, seen = node.input[0], seen + 1
        return None

    pairs: dict[tuple[str, str], list[str]] = {}  # (scale, zero point) -> the tensors it quantizes
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) >= 3 and node.input[0] not in inits:
            pairs.setdefault((node.input[1], node.input[2]), []).append(node.input[0])
    widened_scales: dict[str, tuple[float, float]] = {}  # scale name -> (old step, new step)
    tensors: list[str] = []
    uses: dict[str, int] = {}
    for scale_name, zero_name in pairs:
        for name in (scale_name, zero_name):
            uses[name] = uses.get(name, 0) + 1
    for (scale_name, zero_name), quantized in pairs.items():
        if scale_name not in inits or zero_name not in inits:
            continue
        if uses[scale_name] > 1 or uses[zero_name] > 1:
            continue  # a scale or zero point shared with another pair: widening one would move the other
        if any(n.op_type not in qdq for name in (scale_name, zero_name) for n in readers.get(name, [])):
            continue  # another op reads the encoding itself
        if any(n.op_type == "DequantizeLinear" and (producers.get(n.input[0]) is None
                                                    or producers[n.input[0]].op_type != "QuantizeLinear")
               for name in (scale_name, zero_name) for n in readers.get(name, [])):
            continue  # it also dequantizes stored integers: a new scale would change their values
        scale_t, zero_t = inits[scale_name], inits[zero_name]
        if zero_t.data_type not in (TensorProto.UINT16, TensorProto.INT16) or scale_t.data_type != TensorProto.FLOAT:
            continue
        scale, zero = (onnx.numpy_helper.to_array(scale_t, base_dir=str(path.parent)),
                       onnx.numpy_helper.to_array(zero_t, base_dir=str(path.parent)))
        if scale.size != 1 or zero.size != 1 or not float(scale.ravel()[0]) > 0:
            continue
        if any((maker := origin(name)) is not None and maker.op_type in BOUNDED_OUTPUT_OPS for name in quantized):
            continue
        if any(folded_clip(name) for name in quantized):
            continue
        step, point = _widened(float(scale.ravel()[0]), float(zero.ravel()[0]), zero.dtype, factor)
        widened_scales[scale_name] = (float(scale.ravel()[0]), step)
        scale_t.CopyFrom(onnx.numpy_helper.from_array(np.array(step, dtype=np.float32).reshape(scale.shape), scale_name))
        zero_t.CopyFrom(onnx.numpy_helper.from_array(np.array(point, dtype=zero.dtype).reshape(zero.shape), zero_name))
        tensors.extend(quantized)
    if not widened_scales:
        return [], []
    # int32 biases: scale = the input's scale x the weight's (ORT's quantizer: Conv, ConvTranspose,
    # Gemm; LayerNormalization, InstanceNormalization, BatchNormalization with their scale as the
    # weight); rounded again with the ratio of each widened factor
    biased_ops = ("Conv", "ConvTranspose", "Gemm", "LayerNormalization", "InstanceNormalization", "BatchNormalization")
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits or inits[node.input[0]].data_type != TensorProto.INT32:
            continue
        users = readers.get(node.output[0], [])
        if len(users) != 1 or len(node.input) < 2 or node.input[1] not in inits:
            continue  # a bias two layers share was quantized from one of their inputs: left as it is
        user = users[0]
        if user.op_type not in biased_ops or len(user.input) < 3 or user.input[2] != node.output[0]:
            continue
        factors = []
        for name in user.input[:2]:
            maker = producers.get(name)
            if maker is None or maker.op_type != "DequantizeLinear":
                factors = []
                break
            old_step, new_step = widened_scales.get(maker.input[1], (1.0, 1.0))
            factors.append(new_step / old_step)
        if len(factors) != 2 or factors == [1.0, 1.0]:
            continue
        bias_scale_t, bias_t = inits[node.input[1]], inits[node.input[0]]
        # a model with external data keeps its quantized biases there too (a MiniLM's LayerNorm bias:
        # "should be stored in quantized.onnx.data": read beside the file; written back inline)
        bias_scale = onnx.numpy_helper.to_array(bias_scale_t, base_dir=str(path.parent)).astype(np.float64)
        values = onnx.numpy_helper.to_array(bias_t, base_dir=str(path.parent)).astype(np.float64) * bias_scale
        new_scale = bias_scale * factors[0] * factors[1]
        stored = np.clip(np.round(values / np.where(new_scale > 0, new_scale, 1.0)), -2**31, 2**31 - 1).astype(np.int32)
        bias_scale_t.CopyFrom(onnx.numpy_helper.from_array(new_scale.astype(np.float32), node.input[1]))
        bias_t.CopyFrom(onnx.numpy_helper.from_array(stored, node.input[0]))
    onnx.save(proto, str(path))
    outputs = [v.name for v in graph.output if (maker := producers.get(v.name)) is not None
               and maker.op_type == "DequantizeLinear" and maker.input[1] in widened_scales]
    return tensors, outputs


def floor_weight_scales(path: Path, floor: float = HTP_MULTIPLIER_FLOOR, bound: float = HTP_MIN_MULTIPLIER) -> list[dict]:
    """Raise, in place, every weight scale whose requantization multiplier is below ``bound`` so that
    it reaches ``floor``, requantizing the weight's values (and the int32 bias, whose scale is the
    input's times the weight's) on the new grid. Such a channel's weights are tiny against its
    output's range (its output rounds to about 0 on any EP), so the coarser grid costs nothing the
    output can show, and QNN's HTP computes it (HTP_MIN_MULTIPLIER). Returns what was raised, as
    small_multipliers does; a model with external data is left alone ([])."""
    proto = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer):
        return []
    inits = {t.name: t for t in proto.graph.initializer}
    producers = {out: node for node in proto.graph.node for out in node.output}
    readers: dict[str, int] = {}
    for graph_node in proto.graph.node:
        for name in graph_node.input:
            readers[name] = readers.get(name, 0) + 1
    raised = []
    for found in weight_multipliers(proto, bound):
        node, w_dq, x_scale, y_scale = found["_op"], found["_w_dq"], found["_x_scale"], found["_y_scale"]
        bias_at = WEIGHTED_OPS[node.op_type]
        bias_dq = producers.get(node.input[bias_at]) if bias_at is not None and len(node.input) > bias_at else None
        edited = [name for name in w_dq.input if name] + ([n for n in bias_dq.input if n] if bias_dq is not None else [])
        if any(readers.get(name, 0) > 1 for name in edited if name in inits):
            continue  # an initializer another node reads too would change under it
        scale_t = inits[w_dq.input[1]]
        scale = onnx.numpy_helper.to_array(scale_t).astype(np.float64)
        new_scale = np.maximum(scale, floor * y_scale / x_scale).astype(onnx.numpy_helper.to_array(scale_t).dtype)
        weight_t = inits[w_dq.input[0]]
        q = onnx.numpy_helper.to_array(weight_t)
        zero = (onnx.numpy_helper.to_array(inits[w_dq.input[2]]).astype(np.float64)
                if len(w_dq.input) > 2 and w_dq.input[2] in inits else np.zeros_like(scale))
        shape = [1] * q.ndim
        if scale.size > 1:
            axis = next((a.i for a in w_dq.attribute if a.name == "axis"), 1)
            shape[axis % q.ndim] = -1
        values = (q.astype(np.float64) - zero.reshape(shape)) * scale.reshape(shape)
        info = np.iinfo(q.dtype)
        requantized = np.clip(np.round(values / new_scale.reshape(shape)) + zero.reshape(shape), info.min, info.max)
        if bias_dq is not None and bias_dq.op_type == "DequantizeLinear" and bias_dq.input[0] in inits:
            bias_q, bias_scale = onnx.numpy_helper.to_array(inits[bias_dq.input[0]]), onnx.numpy_helper.to_array(inits[bias_dq.input[1]])
            if bias_q.dtype != np.int32 or bias_scale.size not in (1, new_scale.size):
                continue  # a bias this edit cannot keep consistent: the weight stays as it is
            bias = bias_q.astype(np.float64) * bias_scale.astype(np.float64)
            new_bias_scale = (x_scale * new_scale.astype(np.float64)).astype(np.float32)
            if bias_scale.size == 1 and new_bias_scale.size > 1:
                continue
            inits[bias_dq.input[0]].CopyFrom(onnx.numpy_helper.from_array(
                np.clip(np.round(bias / new_bias_scale), -(2 ** 31), 2 ** 31 - 1).astype(np.int32), bias_dq.input[0]))
            inits[bias_dq.input[1]].CopyFrom(onnx.numpy_helper.from_array(new_bias_scale.reshape(bias_scale.shape), bias_dq.input[1]))
        weight_t.CopyFrom(onnx.numpy_helper.from_array(requantized.astype(q.dtype), w_dq.input[0]))
        scale_t.CopyFrom(onnx.numpy_helper.from_array(new_scale.reshape(scale.shape), w_dq.input[1]))
        raised.append({k: v for k, v in found.items() if not k.startswith("_")})
    if raised:
        onnx.save(proto, str(path))
    return raised


def fp16_activation_matmuls(path: Path) -> list[str]:
    """Compute, in place, every MatMul of two 16-bit activations in FP16: a Cast to float16 on each
    input and a Cast back to float on the output, between the DequantizeLinears and the
    QuantizeLinear. QNN's HTP then runs it as an FP16 MatMul, not as the 16-bit one it computes far
    less precisely (eps/htp.py); the CPU EP runs the same FP16 MatMul, so both sides of quantize's
    gate judge what the HTP computes. Returns the MatMuls changed, by name."""
    proto = onnx.load(str(path), load_external_data=False)
    changed = sixteen_bit_activation_matmuls(proto)
    names = set(changed)
    if not names:
        return []
    graph = proto.graph
    taken = {n for node in graph.node for n in (*node.input, *node.output, node.name)}

    def fresh(base: str) -> str:
        return fresh_name(base, taken)

    nodes = []
    for node in graph.node:
        if node.name not in names:
            nodes.append(node)
            continue
        halves = []
        for index, name in enumerate(node.input):
            half = fresh(f"{node.name}_input{index}_fp16")
            nodes.append(onnx.helper.make_node("Cast", [name], [half], name=half, to=TensorProto.FLOAT16))
            halves.append(half)
        product = fresh(f"{node.name}_fp16")
        output = node.output[0]
        del node.input[:]
        node.input.extend(halves)
        node.output[0] = product
        nodes.append(node)
        nodes.append(onnx.helper.make_node("Cast", [product], [output], name=fresh(f"{node.name}_to_float"),
                                           to=TensorProto.FLOAT))
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(proto, str(path))
    return changed


def fold_conv_transpose_bias(proto: ModelProto, keep: set[str] = frozenset()) -> list[str]:
    """Fold, in place, an Add of a constant per output channel (shape [1, C, 1, 1], [C, 1, 1] or one
    value) that reads a ConvTranspose's output (through Identity nodes), and nothing else does, into that ConvTranspose's
    bias: the same function in float, one node fewer. Paddle exports its transposed convolutions so
    (PP-OCR's detector head). QNN's HTP computes such an Add wrongly once both are quantized
    (eps/htp.py, conv_transpose_bias_adds). Nodes named in ``keep`` are left as they are. Returns the Adds
    folded, by name."""
    graph = proto.graph
    inits, readers, producers, outputs = _graph_facts(graph)
    folded, dropped, gone = [], set(), set()
    for node in graph.node:
        if node.op_type != "Add" or node.name in keep or len(node.input) != 2:
            continue
        for act, const in ((0, 1), (1, 0)):
            tail, conv = _walk_identities(producers, readers, outputs, node.input[act])
            tensor = inits.get(node.input[const])
            if conv is None or conv.op_type != "ConvTranspose" or tensor is None or conv.name in keep:
                continue
            if readers.get(node.input[act], 0) != 1 or node.input[act] in outputs or readers.get(node.input[const], 0) != 1:
                continue
            weight = inits.get(conv.input[1])
            if weight is None or tensor.data_type != TensorProto.FLOAT or weight.data_location == TensorProto.EXTERNAL:
                continue
            channels = weight.dims[1] * next((a.i for a in conv.attribute if a.name == "group"), 1)
            value = onnx.numpy_helper.to_array(tensor).astype(np.float32)
            if value.size == 1:
                per_channel = np.full(channels, value.ravel()[0], np.float32)
            elif value.size == channels and list(value.shape) in ([1, channels, 1, 1], [channels, 1, 1], [1, channels, 1], [channels, 1]):
                per_channel = value.ravel()
            else:
                continue
            bias_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
            if bias_name is not None:
                if bias_name not in inits or readers.get(bias_name, 0) != 1:
                    continue
                per_channel = per_channel + onnx.numpy_helper.to_array(inits[bias_name]).astype(np.float32)
                inits[bias_name].CopyFrom(onnx.numpy_helper.from_array(per_channel, bias_name))
            else:
                bias_name = f"{conv.name or conv.output[0]}_folded_bias"
                graph.initializer.append(onnx.numpy_helper.from_array(per_channel, bias_name))
                while len(conv.input) < 2:
                    conv.input.append("")
                conv.input.append(bias_name)
            gone.update({node.input[act], node.input[const]})
            tail.output[0] = node.output[0]
            dropped.add(id(node))
            folded.append(node.name or node.output[0])
            break
    _drop_folded(graph, dropped, gone)
    return folded


def fold_batch_norms(proto: ModelProto, keep: set[str] = frozenset()) -> list[str]:
    """Fold, in place, a BatchNormalization that reads a Conv's output (through Identity nodes), and
    nothing else does, into that Conv's weights and bias: the same function in float (up to
    float32 rounding), one node fewer. ORT's quantization pre-processing does this too, but ortprep
    keeps the model as given where pre-processing evaluates worse (QNT013), and then the
    BatchNormalization is quantized on its own, which QNN's HTP computes wrongly (eps/htp.py,
    quantized_batch_norms). Nodes named in ``keep`` are left as they are. Returns the BatchNormalizations
    folded, by name."""
    graph = proto.graph
    inits, readers, producers, outputs = _graph_facts(graph)
    folded, dropped, gone = [], set(), set()
    for node in graph.node:
        if node.op_type != "BatchNormalization" or node.name in keep or len(node.input) < 5 or len(node.output) != 1:
            continue
        tail, conv = _walk_identities(producers, readers, outputs, node.input[0])
        if conv is None or conv.op_type != "Conv" or conv.name in keep or readers.get(node.input[0], 0) != 1 \
                or node.input[0] in outputs:
            continue
        names = [conv.input[1], *(conv.input[2:3] if len(conv.input) > 2 and conv.input[2] else []), *node.input[1:5]]
        tensors = [inits.get(name) for name in names]
        if any(t is None or t.data_location == TensorProto.EXTERNAL or t.data_type != TensorProto.FLOAT for t in tensors) \
                or readers.get(conv.input[1], 0) != 1:
            continue
        gamma, beta, mean, var = (onnx.numpy_helper.to_array(inits[n]).astype(np.float64) for n in node.input[1:5])
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        factor = gamma / np.sqrt(var + epsilon)
        weight = onnx.numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        if factor.shape != (weight.shape[0],):
            continue
        has_bias = len(conv.input) > 2 and bool(conv.input[2])
        if has_bias and readers.get(conv.input[2], 0) != 1:
            continue  # a bias another node reads would change under it
        bias = onnx.numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if has_bias else np.zeros(weight.shape[0])
        inits[conv.input[1]].CopyFrom(onnx.numpy_helper.from_array(
            (weight * factor.reshape(-1, *[1] * (weight.ndim - 1))).astype(np.float32), conv.input[1]))
        new_bias = ((bias - mean) * factor + beta).astype(np.float32)
        if has_bias:
            inits[conv.input[2]].CopyFrom(onnx.numpy_helper.from_array(new_bias, conv.input[2]))
        else:
            bias_name = fresh_name(f"{conv.name or conv.output[0]}_folded_bias", set(inits))
            graph.initializer.append(onnx.numpy_helper.from_array(new_bias, bias_name))
            inits[bias_name] = graph.initializer[-1]
            conv.input[:] = [conv.input[0], conv.input[1], bias_name]
        gone.update(n for n in node.input if n and readers.get(n, 0) == 1)
        gone.add(node.input[0])
        tail.output[0] = node.output[0]
        dropped.add(id(node))
        folded.append(node.name or node.output[0])
    _drop_folded(graph, dropped, gone)
    return folded


def _drop_folded(graph, dropped: set[int], gone: set[str]) -> None:
    """Take out the nodes a fold merged into the op before them (by id), and the initializers and
    value infos of the tensors that went with them."""
    if not dropped:
        return
    kept = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    for tensor in [t for t in graph.initializer if t.name in gone]:
        graph.initializer.remove(tensor)
    for value in [v for v in graph.value_info if v.name in gone]:
        graph.value_info.remove(value)


def _walk_identities(producers: dict, readers: dict, outputs: set[str], name: str):
    """(the node that makes ``name``, the node past any Identity nodes before it that only this
    chain reads): a fold looks through the Identity nodes that Paddle's exports put between ops."""
    tail = node = producers.get(name)
    while node is not None and node.op_type == "Identity" and readers.get(node.input[0], 0) == 1 \
            and node.input[0] not in outputs:
        node = producers.get(node.input[0])
    return tail, node


def _graph_facts(graph) -> tuple[dict, dict[str, int], dict, set[str]]:
    """What a fold reads off a graph: its initializers by name, how many nodes read each value
    (subgraphs' nodes included), the node that makes each value, and the graph's outputs."""
    readers: dict[str, int] = {}
    for _, sub in iter_graphs(graph):
        for node in sub.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
    return ({t.name: t for t in graph.initializer}, readers,
            {out: node for node in graph.node for out in node.output}, {v.name for v in graph.output})
