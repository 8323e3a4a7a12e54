"""FP16 conversion that loads and stays accurate.

Built on onnxconverter-common, with what it lacks around it:
- before: constants outside FP16's range (folded into the preceding Conv for BatchNormalization,
  otherwise kept in FP32 with their consumers), tiny values that would flush to zero, ops the
  target EP has no FP16 kernel for, activations that overflow FP16 on real inputs;
- after: repairs of what makes ORT reject the result (Cast nodes whose `to` contradicts the new
  types, stale value_info);
- verification is done by the caller (transforms/conversion.py), which feeds nodes responsible for a
  failure back in here as FP32 nodes.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from enum import Enum

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, numpy_helper

from ortprep.analysis import ModelAnalysis, formal_types
from ortprep.runtime.kernels import support_table
from ortprep.runtime.shapes import symbolic_infer
from ortprep.graphops import outer_scope_names, topological_sort
from ortprep.transforms.fp16_types import drop_cast_round_trips, reconcile_types, run_converter
from ortprep.model import ModelHandle, iter_graphs, subgraphs_of

log = logging.getLogger(__name__)

FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 2.0**-24  # about 5.96e-8: smaller magnitudes become zero
# Headroom for activations measured on a few inputs: real data may reach further.
ACTIVATION_LIMIT = FP16_MAX / 2

# NPUs take FP16 inputs directly (the DirectML NPU sample feeds FP16); everywhere else the
# caller's float32 arrays keep working when the I/O stays float32.


@dataclass(frozen=True)
class KeptNode:
    name: str
    op_type: str
    reason: str
    graph: str = ""  # the subgraph holding it ("/loop.body"), "" for the main graph

    def to_record(self) -> dict:
        return {"name": self.name, "op_type": self.op_type, "reason": self.reason, "graph": self.graph,
                "path": f"{self.graph}/{self.name}" if self.graph else self.name}


class KeepReason(str, Enum):
    """Why a node stays in FP32."""

    ASKED = "asked"  # --block-node
    CONSTANT_RANGE = "constant_range"  # reads a constant beyond FP16's range
    ACTIVATION_RANGE = "activation_range"  # activations beyond FP16's range on the test inputs
    ERROR_STARTS = "error_starts"  # its FP16 output is where the error against FP32 starts
    FEEDS_KEPT = "feeds_kept"  # feeds a kept node whose output differs even in FP32
    NO_RUN = "no_run"  # ORT could not run the FP16 model and no node could be blamed
    CRASH = "crash"  # ORT crashes on it in float16 (found by bisection)


def _float_arrays(graph) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.data_type == TensorProto.FLOAT}


def _consumers(graph) -> dict[str, list[onnx.NodeProto]]:
    result: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            result.setdefault(name, []).append(node)
    return result


@dataclass
class RangeScan:
    overflow: list[tuple[str, float]]  # initializers with finite values beyond FP16_MAX
    underflow: list[tuple[str, int, int]]  # (name, values that flush to zero, values)


def scan_constants(proto: ModelProto) -> RangeScan:
    """Float32 initializers (all graphs) whose values do not survive FP16."""
    overflow, underflow = [], []
    for _, graph in iter_graphs(proto.graph):
        for name, array in _float_arrays(graph).items():
            finite = np.abs(array[np.isfinite(array)])
            if finite.size == 0:
                continue
            peak = float(finite.max())
            if peak > FP16_MAX:
                overflow.append((name, peak))
            tiny = int(np.count_nonzero((finite > 0) & (finite < FP16_MIN_SUBNORMAL)))
            if tiny:
                underflow.append((name, tiny, int(array.size)))
    return RangeScan(overflow, underflow)


def fold_batchnorms(
    proto: ModelProto, tensors: set[str] | None = None, ranks: dict[str, int] | None = None
) -> list[str]:
    """Fold inference-mode BatchNormalization nodes of the main graph whose parameters are
    initializers (those reading any of ``tensors`` when given) into the Conv or ConvTranspose
    before them, computed in float64. Where that is not exact (no such producer, or it feeds
    others too) the BN becomes Mul + Add by the folded per-channel scale and shift, which stay in
    FP16's range even when the variance does not. Returns the names of the folded BN nodes."""
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    consumers = _consumers(graph)
    outputs = {v.name for v in graph.output}
    folded = []
    replacements: dict[int, list[onnx.NodeProto]] = {}
    for bn in list(graph.node):
        if bn.op_type != "BatchNormalization" or len(bn.input) < 5:
            continue
        if tensors is not None and not tensors & set(bn.input[1:5]):
            continue
        if not all(n in inits for n in bn.input[1:5]) or (len(bn.output) > 1 and any(bn.output[1:])):
            continue  # parameters computed at run time, or training-mode outputs in use
        if any(a.name == "training_mode" and a.i for a in bn.attribute):
            continue
        epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        scale, shift, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in bn.input[1:5])
        factor = scale / np.sqrt(var + epsilon)
        offset = shift - mean * factor
        label = bn.name or bn.output[0]
        conv = producers.get(bn.input[0])
        if conv is not None and _fold_into(conv, factor, offset, inits, graph, consumers, outputs, bn):
            conv.output[0] = bn.output[0]
            replacements[id(bn)] = []
        else:
            rank = (ranks or {}).get(bn.input[0]) or _rank(bn.input[0], graph)
            if not rank or rank < 2:
                continue  # unknown rank: the per-channel constants cannot be shaped
            shape = (factor.shape[0],) + (1,) * (rank - 2)
            graph.initializer.extend([
                numpy_helper.from_array(factor.reshape(shape).astype(np.float32), f"{label}.folded_scale"),
                numpy_helper.from_array(offset.reshape(shape).astype(np.float32), f"{label}.folded_shift"),
            ])
            replacements[id(bn)] = [
                onnx.helper.make_node(
                    "Mul", [bn.input[0], f"{label}.folded_scale"], [f"{label}.scaled"], name=f"{label}/mul"
                ),
                onnx.helper.make_node(
                    "Add", [f"{label}.scaled", f"{label}.folded_shift"], [bn.output[0]], name=f"{label}/add"
                ),
            ]
        folded.append(label)
    if replacements:
        rebuilt = []
        for node in graph.node:
            rebuilt.extend(replacements.get(id(node), [node]))
        del graph.node[:]
        graph.node.extend(rebuilt)
        _drop_unused_initializers(proto)
    return folded


def tensor_ranks(proto: ModelProto) -> dict[str, int]:
    """Ranks of the main graph's values from onnx shape inference, on a copy without weights."""
    from ortprep.model import approx_serialized_bytes

    if approx_serialized_bytes(proto) >= 2**28:
        return {}  # a copy would double the weights in memory: use the value_info the model has
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - no ranks is a usable answer
        return {}
    return {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in list(inferred.graph.value_info) + list(inferred.graph.input)
        if v.type.tensor_type.HasField("shape")
    }


def _rank(name: str, graph) -> int | None:
    for value in list(graph.value_info) + list(graph.input) + list(graph.output):
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    return None


def _fold_into(conv, factor, offset, inits, graph, consumers, outputs, bn) -> bool:
    """Fold the BN's per-channel factor and offset into the Conv/ConvTranspose ``conv`` when exact."""
    if (
        conv.op_type not in ("Conv", "ConvTranspose")
        or len(consumers.get(bn.input[0], [])) != 1
        or bn.input[0] in outputs
    ):
        return False
    if (
        len(conv.input) < 2
        or conv.input[1] not in inits
        or (len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits)
    ):
        return False
    group = next((a.i for a in conv.attribute if a.name == "group"), 1)
    weight = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
    if conv.op_type == "ConvTranspose":
        if group != 1 or weight.shape[1] != factor.shape[0]:
            return False
        new_weight = weight * factor.reshape((1, -1) + (1,) * (weight.ndim - 2))
    else:
        if weight.shape[0] != factor.shape[0]:
            return False
        new_weight = weight * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
    bias = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64)
            if len(conv.input) > 2 and conv.input[2] else np.zeros(factor.shape[0]))
    new_bias = bias * factor + offset
    label = conv.name or conv.output[0]
    graph.initializer.extend([
        numpy_helper.from_array(new_weight.astype(np.float32), f"{label}.folded_weight"),
        numpy_helper.from_array(new_bias.astype(np.float32), f"{label}.folded_bias"),
    ])
    del conv.input[1:]
    conv.input.extend([f"{label}.folded_weight", f"{label}.folded_bias"])
    return True


def _drop_unused_initializers(proto: ModelProto) -> None:
    used = {name for _, graph in iter_graphs(proto.graph) for node in graph.node for name in node.input}
    used |= {v.name for v in proto.graph.output}
    keep = [t for t in proto.graph.initializer if t.name in used]
    if len(keep) != len(proto.graph.initializer):
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(keep)


def ep_blocked_ops(handle: ModelHandle, ep: str) -> dict[str, str]:
    """Op types present in the model for which ``ep`` registers no float16 kernel."""
    table = support_table(ep)
    blocked: dict[str, str] = {}
    analysis = ModelAnalysis(handle, symbolic_infer=symbolic_infer)
    for node in analysis.all_nodes():
        if node.op_type in blocked or node.op_type in ("Cast", "Constant"):
            continue
        if not any(facts is not None and facts.dtype == "float" for _, _, facts in formal_types(node)):
            continue
        entries = table.lookup(node.domain, node.op_type)
        if not entries:
            continue  # no data: leave it to verification
        covering = [e for e in entries if e.covers(node.since)] if node.since is not None else entries
        typed = [e for e in covering if e.types]
        if typed and not any("float16" in types for e in typed for types in e.types.values()):
            blocked[node.op_type] = f"{ep} registers no float16 {node.op_type} kernel"
    return blocked


def no_fp16_signature_ops(proto: ModelProto) -> dict[str, str]:
    """Op types in the model that ONNX defines with a float input that cannot be float16 (a fixed
    tensor(float) input, or a type constraint with float but not float16): DynamicQuantizeLinear,
    DequantizeLinear's scale before opset 19, and the like. Converting them makes an invalid model."""
    opsets = {o.domain or "": o.version for o in proto.opset_import}
    found: dict[str, str] = {}
    for _, graph in iter_graphs(proto.graph):
        for node in graph.node:
            if node.op_type in found or node.op_type == "Cast":
                continue
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            try:
                schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, opsets.get("", 1)), domain)
            except onnx.defs.SchemaError:
                # a contrib or custom op (com.microsoft.DynamicQuantizeLSTM, say): its float16
                # signature is unknown here, so it stays FP32
                found[node.op_type] = f"no float16 signature known for {domain or 'ai.onnx'}.{node.op_type}"
                continue
            allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
            for formal in schema.inputs:
                types = allowed.get(formal.type_str, {formal.type_str})
                if "tensor(float)" in types and "tensor(float16)" not in types:
                    found[node.op_type] = (
                        f"ONNX defines no float16 signature for {node.op_type} ('{formal.name}' is float only)"
                    )
                    break
    return found


def activation_overflow_nodes(proto: ModelProto, peaks: dict[str, float]) -> dict[str, float]:
    """Top-level nodes reading or writing a float tensor beyond FP16's safe range on real inputs;
    ``peaks``: each tensor's largest magnitude there (transforms/verify.py: Intermediates.peaks)."""
    flagged: dict[str, float] = {}
    for node in proto.graph.node:
        peak = max((peaks.get(name, 0.0) for name in list(node.input) + list(node.output)), default=0.0)
        if peak > ACTIVATION_LIMIT:
            flagged[node.name] = peak
    return flagged


def ensure_node_names(proto: ModelProto) -> None:
    """Give unnamed nodes stable names: FP32 block lists and reports refer to nodes by name."""
    taken = {node.name for _, graph in iter_graphs(proto.graph) for node in graph.node if node.name}
    for scope, graph in iter_graphs(proto.graph):
        for index, node in enumerate(graph.node):
            if not node.name:
                candidate = f"{node.op_type}_{index}" + (f"_{len(scope)}" if scope else "")
                while candidate in taken:
                    candidate += "_"
                node.name = candidate
                taken.add(candidate)


def convert_once(
    proto: ModelProto, *, keep_io_types: bool, block_ops: set[str], block_nodes: set[str]
) -> tuple[ModelProto, list[str]]:
    """One onnxconverter-common pass with ortprep's range limits, then repairs.
    Returns the converted model and the repairs made."""
    from onnxconverter_common import float16

    source = ModelProto()
    source.CopyFrom(proto)
    op_blocks = set(float16.DEFAULT_OP_BLOCK_LIST) | block_ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # range warnings are reported by scan_constants instead
        converted = run_converter(source, keep_io_types=keep_io_types, op_block_list=op_blocks,
                                  node_block_list=set(block_nodes), min_positive_val=FP16_MIN_SUBNORMAL,
                                  max_finite_val=FP16_MAX)
    original_casts = {n.name for _, g in iter_graphs(proto.graph) for n in g.node if n.op_type == "Cast"}
    round_trips = sum(drop_cast_round_trips(g, original_casts) for _, g in iter_graphs(converted.graph))
    repairs = repair_casts(converted, proto, block_ops, block_nodes)
    if round_trips:
        repairs.append(f"removed {round_trips} float32 -> float16 -> float32 Cast round trip(s)")
    repairs += fold_constant_casts(converted)
    repairs += clear_stale_value_info(converted)
    repairs += reconcile_types(converted, set(block_nodes), op_blocks)
    if topological_sort(converted.graph):
        # The converter sorts nodes without seeing what If/Loop bodies read from outside.
        repairs.append("re-sorted nodes so If/Loop/Scan come after the values their bodies read")
    return converted, repairs


# Casts of constants no larger than this are folded into constants of the cast type (a larger one,
# a weight of a node kept in FP32, would be stored twice or in float32: left to ORT's folding).
FOLD_CAST_ELEMENTS = 4096


def fold_constant_casts(proto: ModelProto) -> list[str]:
    """A Cast whose input is a small constant (an initializer, or a Constant node's ``value``)
    becomes an initializer of the cast type under the Cast's output name. The converter casts
    the constant inputs of nodes kept in FP32 (Resize's scales, for one) back to float32 at run
    time; ORT folds them when a session is created, but the QNN EP, compiling the model through
    ORT's compile API, is given them unfolded and fails to compose its graph (error 7004 on the
    Cast's constant tensor; measured on the NPU journey's layout detector, onnxruntime-qnn 2.7.0)."""
    folded = 0
    for _, graph in iter_graphs(proto.graph):
        values = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attribute in node.attribute:
                    if attribute.name == "value":
                        values.setdefault(node.output[0], attribute.t)
        outputs = {v.name for v in graph.output}
        keep = []
        for node in graph.node:
            tensor = values.get(node.input[0]) if node.op_type == "Cast" and node.input else None
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if (
                tensor is None
                or to is None
                or node.output[0] in outputs
                or tensor.data_location == TensorProto.EXTERNAL
                or int(np.prod(tensor.dims)) > FOLD_CAST_ELEMENTS
            ):
                keep.append(node)
                continue
            array = numpy_helper.to_array(tensor).astype(onnx.helper.tensor_dtype_to_np_dtype(to))
            graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
            folded += 1
        if len(keep) != len(graph.node):
            del graph.node[:]
            graph.node.extend(keep)
            # Constant nodes nobody reads any more go too
            read = {name for n in graph.node for name in n.input} | outputs | {
                name for n in graph.node for _, body in subgraphs_of(n) for name in outer_scope_names(body)}
            unread = [n for n in graph.node if n.op_type == "Constant" and n.output and n.output[0] not in read]
            for node in unread:
                graph.node.remove(node)
    if folded:
        _drop_unused_initializers(proto)
    return [f"folded {folded} Cast(s) of constants into constants of the cast type"] if folded else []


def repair_casts(converted: ModelProto, original: ModelProto, block_ops: set[str], block_nodes: set[str]) -> list[str]:
    """Cast nodes of the original model that cast to float32 now feed FP16 nodes: cast to FP16."""
    original_casts = {
        node.name
        for _, graph in iter_graphs(original.graph)
        for node in graph.node
        if node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT for a in node.attribute)
    }
    repairs = []
    graph_outputs = {v.name for v in converted.graph.output}
    for _, graph in iter_graphs(converted.graph):
        consumers = _consumers(graph)
        for node in graph.node:
            if node.name not in original_casts or node.name in block_nodes or "Cast" in block_ops:
                continue
            readers = consumers.get(node.output[0], [])
            if node.output[0] in graph_outputs or any(r.op_type in block_ops or r.name in block_nodes for r in readers):
                continue
            for attr in node.attribute:
                if attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.FLOAT16
                    repairs.append(f"Cast '{node.name}' now casts to float16 (its consumers compute in float16)")
    return repairs


def clear_stale_value_info(proto: ModelProto) -> list[str]:
    """Drop intermediate value_info (types may be stale after conversion); ORT re-infers them."""
    count = 0
    for _, graph in iter_graphs(proto.graph):
        count += len(graph.value_info)
        del graph.value_info[:]
    return [f"dropped {count} stale value_info entries"] if count else []
