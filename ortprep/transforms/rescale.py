"""Scale an input down by a power of two where the values it leads to overflow FP16, and take the
scale out again where an op absorbs it.

Audio in int16's scale makes an STFT's power reach 1e12; FP16 holds 65504. Keeping those nodes in
FP32 works on an EP with FP32 kernels, not on one that computes float in FP16 (QNN's HTP, DirectML
NPUs). Most such chains are homogeneous: Conv, MatMul, Pow, Add, Clip with constant bounds, pooling
and layout ops scale their output by s^d when their input scales by s. A Log then turns the scale
into an offset (log(s^d x) = log x + d log s), which one Add removes. So ``Mul(input, 2^-k)`` at the
input and that Add after each Log give the same outputs in FP32 (powers of two scale exactly) with
every activation on the way k*d octaves smaller. A floor clipped just before a Log (1e-10, the log of
silence) moves past it, as its log: scaled, it would fall below what FP16 holds. Constants that are
scaled must stay within FP16's normal range. Where the chain meets an op that is not homogeneous
(Exp, Sigmoid, Softmax, an Add of an unscaled tensor) or a graph output still scaled, that input is
not rescaled. Decision and measurement: docs/decisions/fp16-rescale.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ortprep.graphops import Constants, fresh_name, node_dependencies, outer_scope_names
from ortprep.model import iter_graphs, subgraphs_of

# Ops whose float output scales as their (first) float input: layout, pooling, order and sign.
SAME = frozenset({
    "Identity", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Slice", "Gather", "Split",
    "Expand", "Tile", "DepthToSpace", "SpaceToDepth", "Relu", "LeakyRelu", "Abs", "Neg", "MaxPool",
    "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "Cast", "Dropout", "Resize",
})
# Ops whose operands must share one scale (constants are scaled to it).
ALIKE = frozenset({"Add", "Sub", "Max", "Min", "Sum", "Mean", "Concat", "Where"})
# Ops that multiply their operands' scales (with the operand's sign for Div's divisor).
PRODUCT = frozenset({"Mul", "MatMul", "Conv", "ConvTranspose", "Gemm", "Div"})
# Ops whose output no longer depends on a positive scale of their input (indices, shapes, signs).
SCALE_FREE = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "Sign"})
# Headroom under FP16's largest value, 8 octaves: a tensor of degree 2 still fits when the input is
# 16 times louder than any measured.
AIM = 65504.0 / 256
# 2^-24 is FP16's smallest subnormal: a larger k leaves the scale itself unrepresentable.
MAX_OCTAVES = 24
FP16_MAX = 65504.0
# A scaled constant keeps FP16's full precision down to its smallest normal value.
FP16_MIN_NORMAL = 2.0 ** -14


@dataclass
class Plan:
    """What rescaling one input means: its octaves ``k`` (scale 2^-k), each tracked tensor's
    degree d (it scales by 2^(-k*d)), the constants to scale ((node index, input index) -> degree)
    and the Logs to compensate (node index -> degree)."""

    source: str
    octaves: int = 0
    degrees: dict[str, float] = field(default_factory=dict)
    constants: dict[tuple[int, int], float] = field(default_factory=dict)
    logs: dict[int, float] = field(default_factory=dict)
    absorbed_at: list[str] = field(default_factory=list)
    floors: dict[int, int] = field(default_factory=dict)  # Clip node index -> the index of the Log it feeds
    values: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # the constants' values


class _NotHomogeneous(Exception):
    pass


def _subgraph_reads(proto: ModelProto) -> set[str]:
    """Main-graph names read inside If/Loop/Scan bodies (a scaled tensor read there is not followed)."""
    return {name for node in proto.graph.node for _, body in subgraphs_of(node) for name in outer_scope_names(body)}


def trace(proto: ModelProto, source: str) -> Plan | None:
    """The degrees of every tensor ``source`` scales (in node order; ONNX graphs are sorted), or
    None where the chain reaches an op that does not carry a scale through, a subgraph, or a graph
    output still scaled."""
    plan = Plan(source, degrees={source: 1.0})
    constants = Constants(proto.graph)  # not an initializer a caller may feed
    inner = _subgraph_reads(proto)
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(proto.graph.node):
        for name in node.input:
            readers.setdefault(name, []).append(index)
    try:
        for index, node in enumerate(proto.graph.node):
            scaled = [(slot, plan.degrees[name]) for slot, name in enumerate(node.input) if name in plan.degrees]
            if not scaled:
                continue
            if node.op_type == "Clip" and _floor_before_log(proto, node, index, readers, constants, plan):
                plan.degrees[node.output[0]] = dict(scaled)[0]
                continue
            degree = _degree(node, index, scaled, constants, plan)
            if degree is None:
                continue  # scale-free outputs: nothing to follow
            for output in node.output[:1] if node.op_type not in ("Split",) else node.output:
                if output and degree != 0.0:
                    plan.degrees[output] = degree
        if inner & set(plan.degrees):
            return None
        if {output.name for output in proto.graph.output} & set(plan.degrees):
            return None
    except _NotHomogeneous:
        return None
    return plan


def _floor_before_log(proto: ModelProto, node, index: int, readers: dict[str, list[int]],
                      constants: Constants, plan: Plan) -> bool:
    """A Clip with constant bounds (the lower one positive) whose only reader is a Log: recorded
    in ``plan.floors``, to move past the Log as the log of its bounds (Log is monotonic)."""
    if any(a.name in ("min", "max") for a in node.attribute) or node.output[0] in {o.name for o in proto.graph.output}:
        return False
    reading = readers.get(node.output[0], [])
    if len(reading) != 1 or proto.graph.node[reading[0]].op_type != "Log":
        return False
    bounds = [node.input[slot] if len(node.input) > slot and node.input[slot] else None for slot in (1, 2)]
    if any(b is not None and (b not in constants or constants[b].size != 1) for b in bounds) or node.input[0] in bounds:
        return False
    low = float(constants[bounds[0]].reshape(())) if bounds[0] else None
    high = float(constants[bounds[1]].reshape(())) if bounds[1] else None
    if (low is not None and not low > 0) or (high is not None and not high > 0):
        return False
    plan.floors[index] = reading[0]
    return True


def _degree(node, index: int, scaled: list[tuple[int, float]], constants: Constants,
            plan: Plan) -> float | None:
    """The degree of ``node``'s output given its scaled inputs ``scaled`` [(slot, degree)];
    records constants to scale and Logs to compensate in ``plan``. None: the output is scale-free."""
    op = node.op_type
    slots = dict(scaled)
    if op in SCALE_FREE:
        return None
    if op in SAME:
        if set(slots) != {0}:
            raise _NotHomogeneous(op)  # a scaled shape, index or pads: not a value to scale
        if op == "Cast" and not any(a.name == "to" and a.i == TensorProto.FLOAT for a in node.attribute):
            raise _NotHomogeneous(op)  # to an integer (rounding), or another float type (the offsets are float32)
        if op == "Resize" and any(a.name == "mode" and a.s == b"cubic" for a in node.attribute):
            raise _NotHomogeneous(op)  # cubic overshoot is still linear; kept out to stay simple
        if op == "Resize" and any(a.name == "coordinate_transformation_mode" and a.s == b"tf_crop_and_resize"
                                  for a in node.attribute):
            raise _NotHomogeneous(op)  # outside the roi it writes extrapolation_value, unscaled
        return slots[0]
    if op == "Pow":
        exponent = constants.get(node.input[1]) if len(node.input) > 1 else None
        if 1 in slots or exponent is None or exponent.size != 1:
            raise _NotHomogeneous(op)
        return slots[0] * float(exponent.reshape(()))
    if op == "Sqrt":
        return slots[0] / 2
    if op == "Reciprocal":
        return -slots[0]
    if op == "Log":
        plan.logs[index] = slots[0]
        plan.absorbed_at.append(node.name or f"Log #{index}")
        return 0.0
    if op == "Clip":
        if any(a.name in ("min", "max") for a in node.attribute):
            raise _NotHomogeneous(op)  # opset < 11 bounds as attributes
        for slot in (1, 2):
            if slot in slots:
                raise _NotHomogeneous(op)
            if len(node.input) > slot and node.input[slot]:
                if node.input[slot] not in constants:
                    raise _NotHomogeneous(op)
                plan.constants[(index, slot)] = slots[0]
                plan.values[(index, slot)] = constants[node.input[slot]]
        return slots[0]
    if op in PRODUCT:
        if op == "Gemm" or (op in ("Conv", "ConvTranspose") and len(node.input) > 2 and node.input[2]):
            if 2 in slots:
                raise _NotHomogeneous(op)
        total = sum(-d if (op == "Div" and slot == 1) else d for slot, d in slots.items() if slot < 2)
        if op in ("Gemm", "Conv", "ConvTranspose") and len(node.input) > 2 and node.input[2] and total:
            if node.input[2] not in constants:
                raise _NotHomogeneous(op)
            plan.constants[(index, 2)] = total
            plan.values[(index, 2)] = constants[node.input[2]]
        return total
    if op in ALIKE:
        data = range(1, len(node.input)) if op == "Where" else range(len(node.input))
        if op == "Where" and 0 in slots:
            raise _NotHomogeneous(op)
        degrees = {slots[slot] for slot in data if slot in slots}
        if len(degrees) != 1:
            raise _NotHomogeneous(op)
        (degree,) = degrees
        for slot in data:
            if slot in slots or not node.input[slot]:
                continue
            if node.input[slot] not in constants:
                raise _NotHomogeneous(op)  # an unscaled tensor added to a scaled one
            plan.constants[(index, slot)] = degree
            plan.values[(index, slot)] = constants[node.input[slot]]
        return degree
    raise _NotHomogeneous(op)


def choose_octaves(plan: Plan, peaks: dict[str, float], aim: float = AIM) -> int | None:
    """The fewest octaves k that bring every tracked tensor's measured peak under ``aim``; None
    where no k does (a tensor of negative degree grows as the others shrink) or k > MAX_OCTAVES."""
    low, high = 0.0, math.inf  # k must lie in [low, high]
    for name, degree in plan.degrees.items():
        peak = peaks.get(name, 0.0)
        if peak <= 0.0 or not math.isfinite(peak):
            continue
        need = math.log2(peak / aim) / degree  # peak * 2^(-k*d) <= aim
        if degree > 0:
            low = max(low, need)
        else:
            high = min(high, need)
    for key, degree in plan.constants.items():  # scaled constants stay within FP16's normal range
        magnitudes = np.abs(np.asarray(plan.values[key], np.float64))
        magnitudes = magnitudes[np.isfinite(magnitudes) & (magnitudes > 0)]
        if magnitudes.size == 0 or degree == 0:
            continue
        if degree > 0:  # the smallest shrinks: min * 2^(-k*d) >= FP16_MIN_NORMAL
            high = min(high, math.log2(float(magnitudes.min()) / FP16_MIN_NORMAL) / degree)
        else:  # the largest grows: max * 2^(k*|d|) <= aim
            high = min(high, math.log2(aim / float(magnitudes.max())) / -degree)
    octaves = max(0, math.ceil(low - 1e-9))
    if octaves > high or octaves > MAX_OCTAVES:
        return None
    return octaves


def rescaled(proto: ModelProto, plans: list[Plan]) -> tuple[ModelProto, list[Plan]]:
    """``proto`` with every plan applied, each traced again on the graph the one before wrote
    (their node indices move), and the plans applied; one whose input no longer traces is left out."""
    applied = []
    for plan in plans:
        again = trace(proto, plan.source)
        if again is None:
            continue
        again.octaves = plan.octaves
        proto = apply_rescale(proto, again)
        applied.append(plan)
    return proto, applied


def plan_rescale(proto: ModelProto, peaks: dict[str, float], limit: float) -> list[Plan]:
    """For each float graph input whose chain reaches a tensor over ``limit`` (measured ``peaks``)
    and carries a scale through to the outputs: the plan with its octaves."""
    plans = []
    for graph_input in proto.graph.input:
        if graph_input.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        if peaks.get(graph_input.name, 0.0) > FP16_MAX:
            continue  # FP16 cannot hold the input itself: its Cast overflows before any scale
        plan = trace(proto, graph_input.name)
        if plan is None or not any(peaks.get(name, 0.0) > limit for name in plan.degrees):
            continue
        octaves = choose_octaves(plan, peaks)
        if not octaves:
            continue
        plan.octaves = octaves
        plans.append(plan)
    return plans


def apply_rescale(proto: ModelProto, plan: Plan) -> ModelProto:
    """A copy of ``proto`` with ``plan`` applied: Mul(source, 2^-k) feeding its readers, scaled
    copies of the constants, an Add after each Log, each floor moved past its Log."""
    out = ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    constants = Constants(out.graph)
    scale = 2.0 ** -plan.octaves
    taken, node_names = set(), set()
    for _, each in iter_graphs(graph):  # names anywhere: a body may define what the main graph adds
        taken |= {name for node in each.node for name in list(node.input) + list(node.output)}
        taken |= {init.name for init in each.initializer} | {v.name for v in each.input} | {v.name for v in each.output}
        node_names |= {node.name for node in each.node}

    def fresh(base: str, names: set[str] = taken) -> str:
        return fresh_name(base, names)

    def constant(value: np.ndarray, base: str) -> str:
        name = fresh(base)
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    swapped = set()
    for (index, slot), degree in plan.constants.items():
        node = graph.node[index]
        swapped.add(node.input[slot])
        value = constants[node.input[slot]]
        scaled = (value.astype(np.float64) * scale ** degree).astype(value.dtype)
        node.input[slot] = constant(scaled, f"{node.input[slot]}_x2^{-plan.octaves * degree:g}")
    floors = {log: graph.node[clip] for clip, log in plan.floors.items()}
    new_nodes = []
    for index, node in enumerate(graph.node):
        if index in plan.floors:
            continue  # moved past its Log, below
        if index in floors:  # the Log reads what its floor read
            node.input[0] = floors[index].input[0]
        new_nodes.append(node)
        if index not in plan.logs:
            continue
        final = node.output[0]
        raw = node.output[0] = fresh(f"{final}_rescaled")
        offset = constant(np.array(plan.logs[index] * plan.octaves * math.log(2.0), np.float32), f"{final}_offset")
        unscale = fresh(f"{node.name or 'Log'}_unscale", node_names)
        if index not in floors:
            new_nodes.append(helper.make_node("Add", [raw, offset], [final], name=unscale))
            continue
        unscaled = fresh(f"{final}_unscaled")
        new_nodes.append(helper.make_node("Add", [raw, offset], [unscaled], name=unscale))
        clip = floors[index]
        bounds = []
        for slot in (1, 2):
            bound = clip.input[slot] if len(clip.input) > slot and clip.input[slot] else None
            bounds.append(constant(np.log(constants[bound].astype(np.float32)), f"{bound}_log") if bound else "")
        while bounds and not bounds[-1]:
            bounds.pop()
        new_nodes.append(helper.make_node("Clip", [unscaled, *bounds], [final],
                                          name=fresh(f"{clip.name or 'Clip'}_after_log", node_names)))
    scaled_input = fresh(f"{plan.source}_x2^-{plan.octaves}")
    factor = constant(np.array(scale, np.float32), f"{plan.source}_scale")
    for node in new_nodes:
        for slot, name in enumerate(node.input):
            if name == plan.source:
                node.input[slot] = scaled_input
    entry = helper.make_node("Mul", [plan.source, factor], [scaled_input],
                             name=fresh(f"{plan.source}_rescale", node_names))
    del graph.node[:]
    graph.node.extend([entry, *new_nodes])
    read = {name for node in graph.node for name in node_dependencies(node)} | {o.name for o in graph.output}
    gone = (swapped | {floors[i].input[slot] for i in floors for slot in (1, 2) if len(floors[i].input) > slot}) - read
    kept = [init for init in graph.initializer if init.name not in gone]  # only what the rescale replaced
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out
