"""A float model's graph made ready for ORT's quantizer, on ONNX protos only (no runs).

Constant weights to initializers, node names, the opset per-channel QDQ needs, the nodes that must
stay float because they read a sentinel constant, whether a model is already quantized, and the
folds QNN's HTP needs (a ConvTranspose's bias Add, a BatchNormalization after a Conv).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ortprep.errors import UsageError
from ortprep.graphops import fresh_name
from ortprep.model import iter_graphs
from ortprep.transforms.fp16 import ensure_node_names
from ortprep.transforms.qdq.facts import INT_TYPES, QUANTIZED_OPS

SENTINEL = 1e30  # a constant at least this large is a stand-in for infinity, not a value


def constants_to_initializers(proto: ModelProto) -> int:
    """Weights held in Constant nodes become initializers (ORT's quantizer wants initializers)."""
    moved = 0
    for _, graph in iter_graphs(proto.graph):
        keep = []
        for node in graph.node:
            value = next((a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
            if (node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None
                    and len(node.attribute) == 1):
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
        if tensor.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                TensorProto.DOUBLE) and int(np.prod(tensor.dims)) <= 1 << 20:
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


def already_quantized(proto: ModelProto) -> str | None:
    """What shows that a model is already quantized (QDQ or QOperator nodes), or None."""
    ops: dict[str, int] = {}
    for _, graph in iter_graphs(proto.graph):
        for node in graph.node:
            if node.op_type in QUANTIZED_OPS:
                ops[node.op_type] = ops.get(node.op_type, 0) + 1
    if not ops:
        return None
    weights = sum(1 for _, g in iter_graphs(proto.graph) for t in g.initializer if t.data_type in INT_TYPES
                  and len(t.dims) >= 1
                  and int(np.prod(t.dims)) > 1)
    listed = ", ".join(f"{count} {op}" for op, count in sorted(ops.items(), key=lambda kv: -kv[1])[:5])
    return f"{listed}; {weights} 8-bit (or smaller) integer weight tensor(s)"


def fold_conv_transpose_bias(proto: ModelProto, keep: set[str] = frozenset()) -> list[str]:
    """Fold, in place, an Add of a constant per output channel (shape [1, C, 1, 1], [C, 1, 1] or one
    value) that reads a ConvTranspose's output (through Identity nodes), and nothing else does, into
    that ConvTranspose's bias: the same function in float, one node fewer. Paddle exports its
    transposed convolutions so (PP-OCR's detector head). QNN's HTP computes such an Add wrongly once
    both are quantized (eps/htp.py, conv_transpose_bias_adds). Nodes named in ``keep`` are left as
    they are. Returns the Adds folded, by name."""
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
            if readers.get(node.input[act],
                           0) != 1 or node.input[act] in outputs or readers.get(node.input[const], 0) != 1:
                continue
            weight = inits.get(conv.input[1])
            if weight is None or tensor.data_type != TensorProto.FLOAT or weight.data_location == TensorProto.EXTERNAL:
                continue
            channels = weight.dims[1] * next((a.i for a in conv.attribute if a.name == "group"), 1)
            value = onnx.numpy_helper.to_array(tensor).astype(np.float32)
            if value.size == 1:
                per_channel = np.full(channels, value.ravel()[0], np.float32)
            elif value.size == channels and list(value.shape) in ([1, channels, 1, 1], [channels, 1, 1],
                                                                  [1, channels, 1], [channels, 1]):
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
        if any(t is None or t.data_location == TensorProto.EXTERNAL or t.data_type != TensorProto.FLOAT
               for t in tensors) \
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
        bias = (onnx.numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if has_bias
                else np.zeros(weight.shape[0]))
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
