"""Edits to a QDQ model's encodings after ORT's quantizer, on ONNX protos only (no runs).

16-bit activation encodings widened for headroom, weight scales raised where QNN's HTP computes a
tiny requantization multiplier wrongly, and MatMuls of two 16-bit activations computed in FP16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ortprep.eps.htp import (
    HTP_MIN_MULTIPLIER,
    HTP_MULTIPLIER_FLOOR,
    WEIGHTED_OPS,
    sixteen_bit_activation_matmuls,
    weight_multipliers,
)
from ortprep.graphops import fresh_name

# Ops whose output range is known whatever the input (QNN fixes their 16-bit encodings too):
# their calibrated range needs no headroom.
BOUNDED_OUTPUT_OPS = ("Sigmoid", "Tanh", "Softmax", "LogSoftmax", "HardSigmoid")
OUTPUT_HEADROOM_16 = 2.0  # 16-bit activation encodings are widened this much (1 bit of 16)
# Ops that move values without computing new ones: a QDQ model's tensors through them share one
# encoding (the EP requires it: QNN's Transpose, Reshape); looked through for the op that computes one.
VALUE_MOVES = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


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
    outputs: an unseen input whose values reach past it is clipped
    (docs/decisions/reduce-quantize-measurements.md). A 16-bit grid affords the headroom: doubling
    a range costs one bit of sixteen.

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
            if node.op_type not in qdq and node.op_type not in VALUE_MOVES:
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
        scale_t.CopyFrom(onnx.numpy_helper.from_array(np.array(step, dtype=np.float32).reshape(scale.shape),
                                                      scale_name))
        zero_t.CopyFrom(onnx.numpy_helper.from_array(np.array(point, dtype=zero.dtype).reshape(zero.shape), zero_name))
        tensors.extend(quantized)
    if not widened_scales:
        return [], []
    # int32 biases: scale = the input's scale x the weight's (ORT's quantizer: Conv, ConvTranspose,
    # Gemm; LayerNormalization, InstanceNormalization, BatchNormalization with their scale as the
    # weight); rounded again with the ratio of each widened factor
    biased_ops = ("Conv", "ConvTranspose", "Gemm", "LayerNormalization", "InstanceNormalization", "BatchNormalization")
    for node in graph.node:
        if (node.op_type != "DequantizeLinear" or node.input[0] not in inits
                or inits[node.input[0]].data_type != TensorProto.INT32):
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


def floor_weight_scales(path: Path, floor: float = HTP_MULTIPLIER_FLOOR,
                        bound: float = HTP_MIN_MULTIPLIER) -> list[dict]:
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
        edited = [name for name in w_dq.input
                  if name] + ([n for n in bias_dq.input if n] if bias_dq is not None else [])
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
            bias_q = onnx.numpy_helper.to_array(inits[bias_dq.input[0]])
            bias_scale = onnx.numpy_helper.to_array(inits[bias_dq.input[1]])
            if bias_q.dtype != np.int32 or bias_scale.size not in (1, new_scale.size):
                continue  # a bias this edit cannot keep consistent: the weight stays as it is
            bias = bias_q.astype(np.float64) * bias_scale.astype(np.float64)
            new_bias_scale = (x_scale * new_scale.astype(np.float64)).astype(np.float32)
            if bias_scale.size == 1 and new_bias_scale.size > 1:
                continue
            inits[bias_dq.input[0]].CopyFrom(onnx.numpy_helper.from_array(
                np.clip(np.round(bias / new_bias_scale), -(2 ** 31), 2 ** 31 - 1).astype(np.int32), bias_dq.input[0]))
            inits[bias_dq.input[1]].CopyFrom(onnx.numpy_helper.from_array(new_bias_scale.reshape(bias_scale.shape),
                                                                          bias_dq.input[1]))
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
