"""Keeping nodes of a graph off an EP, and the graph as units a search can cut into models of
their own (the probes of ortprep/prove/culprits.py).

:class:`GraphCut`: the main graph as *units* (a node with the activation Q/DQ nodes of its QDQ node
unit, or an If/Loop/Scan node with its subgraphs whole; constant work comes along with the units
that read it) and the model of any set of them.

:func:`keep_off_ep`: the graph with named nodes moved into If nodes whose two branches are the
same, so that ORT runs them on the CPU EP while the EP takes the rest (``convert --keep-off-ep``,
the graph fix that ``check --prove`` measures).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ortprep.analysis import skeleton
from ortprep.errors import OrtprepError
from ortprep.graphops import fresh_name, localize_body_initializers, node_dependencies, topological_sort
from ortprep.model import ModelHandle, subgraphs_of

log = logging.getLogger(__name__)

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# Attributes that follow the sizes of the tensors: units alike in the rest share a signature.
SIZE_ATTRIBUTES = ("group", "kernel_shape", "pads", "output_shape", "output_padding")
# Not constant work even when their inputs are constants: ORT does not fold them.
NOT_FOLDED = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli")


def has_subgraphs(node) -> bool:
    return any(True for _ in subgraphs_of(node))


class CutError(OrtprepError):
    """A part of the graph that cannot become a model of its own (a value of unknown type)."""


# --------------------------------------------------------------------------- the graph, in units


class GraphCut:
    """The main graph of ``proto`` as units a search keeps or drops, and the model of any set of
    them. ``folder``: where external weights live (probes carry the bytes they need)."""

    def __init__(self, proto, folder: Path | None = None) -> None:
        import onnx

        self.proto = proto
        self.folder = folder
        self.nodes = list(proto.graph.node)
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton(proto), strict_mode=False)
        except Exception as exc:  # noqa: BLE001 - onnx raises several types; the model's own value_info remains
            log.info("shape inference failed (%s); probes use the model's own value_info", exc)
            inferred = proto
        graph = inferred.graph
        self.types = {v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)}
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.graph_outputs = [o.name for o in proto.graph.output]
        self.reads = [list(dict.fromkeys([n for n in node.input if n]
                                         + sorted(node_dependencies(node) - set(node.input))))
                      for node in self.nodes]
        self.producer = {out: index for index, node in enumerate(self.nodes) for out in node.output if out}
        self.consumers: dict[str, list[int]] = {}
        for index, names in enumerate(self.reads):
            for name in names:
                self.consumers.setdefault(name, []).append(index)
        self.free = self._constant_work()
        self.units = self._units()
        self.unit_of = {index: u for u, unit in enumerate(self.units) for index in unit}
        self._signatures: dict[int, tuple] = {}

    # -- which nodes are constant work, which nodes form a unit

    def _static(self, name: str) -> bool:
        value = self.types.get(name)
        if value is None or not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            return False
        return all(d.HasField("dim_value") and d.dim_value >= 0
                   for d in value.type.tensor_type.shape.dim)  # -1: Paddle's "any"

    def _constant_work(self) -> set[int]:
        free: set[int] = set()
        for index, node in enumerate(self.nodes):
            if has_subgraphs(node) or node.op_type in NOT_FOLDED:
                continue
            constant = all(name in self.initializers or (name in self.producer and self.producer[name] in free)
                           for name in self.reads[index])
            if node.op_type in ("Shape", "Size") and node.input and self._static(node.input[0]):
                constant = True
            if constant:
                free.add(index)
        return free

    def _units(self) -> list[list[int]]:
        owner: dict[int, int] = {}  # a Q/DQ node -> the node whose unit it joins
        for index, node in enumerate(self.nodes):
            if index in self.free or node.op_type not in QDQ_OPS:
                continue
            if node.op_type == "DequantizeLinear":
                users = self.consumers.get(node.output[0], [])
                if len(users) == 1 and users[0] not in self.free and self.nodes[users[0]].op_type not in QDQ_OPS:
                    owner[index] = users[0]
            else:
                source = self.producer.get(node.input[0])
                if source is not None and source not in self.free and self.nodes[source].op_type not in QDQ_OPS:
                    owner[index] = source
        groups: dict[int, list[int]] = {}
        for index in range(len(self.nodes)):
            if index in self.free:
                continue
            groups.setdefault(owner.get(index, index), []).append(index)
        return sorted((sorted(group) for group in groups.values()), key=lambda group: group[0])

    def main_nodes(self, unit: int) -> list[int]:
        """The nodes a unit is named by: its op, without the Q/DQ nodes it carries."""
        members = self.units[unit]
        named = [i for i in members if self.nodes[i].op_type not in QDQ_OPS]
        return named or members

    def signature(self, unit: int) -> tuple:
        """What makes two units alike: op, domain, input dtypes and the attributes that do not
        follow the tensors' sizes (strides, dilations, alpha: not group, kernel_shape, pads)."""
        import onnx

        if unit not in self._signatures:
            node = self.nodes[self.main_nodes(unit)[0]]
            attributes = tuple(sorted((a.name, repr(onnx.helper.get_attribute_value(a))) for a in node.attribute
                                      if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                      and a.name not in SIZE_ATTRIBUTES))
            self._signatures[unit] = (node.op_type, node.domain, attributes,
                                      tuple(_describe(self.value_info(n)).split("[")[0] for n in node.input if n))
        return self._signatures[unit]

    def label(self, index: int) -> str:
        node = self.nodes[index]
        return node.name or f"{node.op_type}#{index}"

    def value_info(self, name: str):
        import onnx

        if name in self.initializers:
            tensor = self.initializers[name]
            return onnx.helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
        return self.types.get(name)

    def with_constant_work(self, indices: set[int]) -> set[int]:
        """``indices`` and the constant work they read, transitively."""
        chosen = set(indices)
        stack = list(chosen)
        while stack:
            for name in self.reads[stack.pop()]:
                source = self.producer.get(name)
                if source is not None and source in self.free and source not in chosen:
                    chosen.add(source)
                    stack.append(source)
        return chosen

    # -- the model of a set of units

    def probe(self, units: Sequence[int]):
        """The model holding ``units`` (and the constant work they read). Raises CutError when a
        value it reads from outside has no known tensor type."""
        import onnx
        from onnx import helper

        chosen = self.with_constant_work({i for u in units for i in self.units[u]})
        order = sorted(chosen)
        made = {out for i in order for out in self.nodes[i].output if out}
        inputs, weights, seen = [], [], set()
        for index in order:
            for name in self.reads[index]:
                if name in made or name in seen:
                    continue
                seen.add(name)
                if name in self.initializers:
                    weights.append(self._weight(name))
                    continue
                value = self.types.get(name)
                if value is None or not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
                    raise CutError(f"value '{name}' read by node '{self.label(index)}' ({self.nodes[index].op_type}) "
                                   "has no type that shape inference knows, so it cannot become a probe's input")
                inputs.append(value)
        outputs = self._outputs(order, chosen)
        graph = helper.make_graph([self.nodes[i] for i in order], "probe", inputs, outputs, weights)
        model = onnx.ModelProto()
        model.CopyFrom(helper.make_model(graph, opset_imports=list(self.proto.opset_import),
                                         ir_version=self.proto.ir_version))
        model.functions.extend(self.proto.functions)
        return model

    def _outputs(self, order: list[int], chosen: set[int]) -> list:
        from onnx import helper

        graph_outputs = set(self.graph_outputs)
        names = []
        for index in order:
            if index in self.free:
                continue  # constant work: what it makes is no probe's output
            kept = False
            for name in self.nodes[index].output:
                if not name:
                    continue
                users = self.consumers.get(name, [])
                outside = name in graph_outputs or any(user not in chosen for user in users)
                inside = any(user in chosen for user in users)
                if outside:
                    names.append(name)
                    kept = True
                elif inside:
                    kept = True
            if not kept:
                # a node whose outputs nothing reads in the original either: keep it alive
                names.append(next(name for name in self.nodes[index].output if name))
        if not names:
            names.append(next(name for name in self.nodes[order[-1]].output if name))
        return [self.types[name] if name in self.types else helper.make_empty_tensor_value_info(name) for name in names]

    def _weight(self, name: str):
        import onnx

        tensor = self.initializers[name]
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return tensor
        if self.folder is None:
            raise CutError(f"initializer '{name}' lives in external data, and the model's folder is unknown")
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        onnx.external_data_helper.load_external_data_for_tensor(copy, str(self.folder))
        copy.data_location = onnx.TensorProto.DEFAULT
        del copy.external_data[:]
        return copy


def describe_node(cut: GraphCut, index: int) -> dict[str, Any]:
    """A node as a report names it: name, op, attributes, inputs and outputs as dtype[dims]."""
    import onnx

    node = cut.nodes[index]
    attributes: dict[str, Any] = {}
    for attribute in node.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if attribute.type == onnx.AttributeProto.GRAPH:
            value = f"<subgraph '{value.name}': {len(value.node)} nodes>"
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            value = [f"<subgraph '{g.name}': {len(g.node)} nodes>" for g in value]
        elif isinstance(value, (list, tuple)):
            value = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in value]
            if not all(isinstance(v, (int, float, str)) for v in value):
                continue
        elif not isinstance(value, (int, float, str)):
            continue
        attributes[attribute.name] = value
    described = {"name": cut.label(index), "op_type": node.op_type, "attributes": attributes,
                 "inputs": [_describe(cut.value_info(name)) for name in node.input if name],
                 "outputs": [_describe(cut.value_info(name)) for name in node.output if name]}
    if node.domain and node.domain != "ai.onnx":
        described["domain"] = node.domain
    return described


def _describe(value) -> str:
    """dtype[dims] of a value_info, or "?"."""
    if value is None or not value.type.HasField("tensor_type"):
        return "?"
    import onnx

    tensor = value.type.tensor_type
    dims = ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
    return f"{onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else '?'}[{dims}]"


# --------------------------------------------------------------------------- keeping nodes off the EP


OFF_EP_PREFIX = "ortprep_off_ep"


def keep_off_ep(handle: ModelHandle, node_names: Sequence[str]):
    """The model with each named node's unit (its QDQ Q/DQ nodes and the constant work only it
    reads come along) moved into an If whose two branches are that same unit, so ORT runs it on
    the CPU EP, exactly as before, while the EP takes the rest.

    Why If nodes, and why this condition: docs/decisions/reduce-off-ep-rewrite.md.
    Returns (model, labels of the nodes moved); raises CutError where it cannot."""
    import onnx
    from onnx import helper

    proto = onnx.ModelProto()
    proto.CopyFrom(handle.proto)
    if not handle.weights_loaded:  # the caller's handle stays graph-only
        onnx.external_data_helper.load_external_data_for_model(proto, str(handle.folder))
    cut = GraphCut(proto, handle.folder)
    by_name = {cut.label(index): index for index in range(len(cut.nodes))}
    missing = [name for name in node_names if name not in by_name]
    if missing:
        raise CutError(f"node(s) {', '.join(missing)} are not in the main graph")
    groups: list[set[int]] = []
    for unit in dict.fromkeys(cut.unit_of[by_name[name]] for name in node_names if by_name[name] in cut.unit_of):
        members = set(cut.units[unit])
        groups.append(members | _exclusive_constant_work(cut, members))
    groups = _merge_adjacent(cut, _absorb_sandwiched(cut, groups))
    used = {name for node in cut.nodes for name in list(node.input) + list(node.output)} | set(cut.initializers) | {
        v.name for v in proto.graph.input}
    new_nodes: list = []
    moved: list[str] = []
    taken: set[int] = set()
    for number, group in enumerate(groups):
        order = sorted(group)
        made = {out for i in order for out in cut.nodes[i].output if out}
        outside = [name for i in order for name in cut.nodes[i].output if name and (
            name in cut.graph_outputs or any(user not in group for user in cut.consumers.get(name, [])))]
        if not outside:
            continue
        renamed = {name: fresh_name(f"{name}_{OFF_EP_PREFIX}", used) for name in made}
        body_outputs = []
        for name in outside:
            value = cut.value_info(name)
            if value is None or not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
                raise CutError(f"value '{name}' has no type that shape inference knows, so it cannot leave an If")
            typed = onnx.ValueInfoProto()
            typed.CopyFrom(value)
            typed.name = renamed[name]
            body_outputs.append(typed)
        branches = []
        for branch in ("then", "else"):
            body_nodes = []
            for i in order:
                node = onnx.NodeProto()
                node.CopyFrom(cut.nodes[i])
                node.input[:] = [renamed.get(name, name) for name in node.input]
                node.output[:] = [renamed.get(name, name) for name in node.output]
                _rename_outer_reads(node, renamed)
                body_nodes.append(node)
            branches.append(helper.make_graph(body_nodes, f"{OFF_EP_PREFIX}_{number}_{branch}", [], body_outputs))
        named = [cut.nodes[i].name for i in order if i not in cut.free and cut.nodes[i].op_type not in QDQ_OPS]
        moved.extend(cut.label(i) for i in order)
        taken |= group
        if_name = fresh_name(f"{OFF_EP_PREFIX}_{named[0] if named else number}", used)
        cond = _condition(cut, _condition_source(cut, proto, order, group), used, new_nodes)
        new_nodes.append(helper.make_node("If", [cond], outside, name=if_name, then_branch=branches[0],
                                          else_branch=branches[1]))
    if not moved:
        raise CutError("the named nodes make nothing that the rest of the graph reads")
    kept = [node for index, node in enumerate(cut.nodes) if index not in taken]
    del proto.graph.node[:]
    proto.graph.node.extend(kept + new_nodes)
    # the initializers the moved units read go into their branches: ORT's EP-context writer (compile)
    # dropped a scale read from inside an If that a Q node in the QNN partition shared
    localize_body_initializers(proto.graph)
    topological_sort(proto.graph)
    return proto, moved


def _absorb_sandwiched(cut: GraphCut, groups: list[set[int]]) -> list[set[int]]:
    """Q/DQ nodes that only moved nodes read, and that read only what moved nodes make, graph inputs
    or constants, join the groups. A DequantizeLinear shared by two moved Convs belongs to neither's
    unit: left between them it made two Ifs with the EP's node between. A QuantizeLinear of a graph
    input that only moved nodes read, left outside, QNN refuses (it takes no Q of a graph input).
    Either way QNN's capability became invalid and ORT ran every node on the CPU EP (measured:
    docs/decisions/reduce-off-ep-rewrite.md).

    A node joins the group of the moved node it reads (the edges stay those of the graph, so no
    group comes to wait on itself); one that reads a graph input joins a group of its readers that
    no other of them reaches, or stays out."""
    merged = [set(group) for group in groups]
    moved = set().union(*merged) if merged else set()
    inputs = {value.name for value in cut.proto.graph.input} - set(cut.initializers)

    def users(index: int) -> list[int]:
        return [user for name in cut.nodes[index].output if name for user in cut.consumers.get(name, [])]

    def sources(index: int) -> list[int]:
        return [cut.producer[name] for name in cut.reads[index] if name in cut.producer]

    # the largest set whose every node is read only inside (moved or in the set) and reads only from
    # inside, constants or graph inputs: a graph input's Q and the shared DQ after it go together
    absorbed = {index for index, node in enumerate(cut.nodes) if index not in moved and index not in cut.free
                and node.op_type in QDQ_OPS and not any(name in cut.graph_outputs for name in node.output if name)}
    changed = True
    while changed:
        changed = False
        for index in sorted(absorbed):
            inside = moved | absorbed
            read_by, reads = users(index), sources(index)
            if (not read_by or not all(user in inside for user in read_by)
                    or not all(source in inside or source in cut.free for source in reads)
                    or not (any(source in inside for source in reads)
                            or any(name in inputs for name in cut.reads[index]))):
                absorbed.discard(index)
                changed = True
    home: dict[int, int] = {index: number for number, group in enumerate(merged) for index in group}
    for index in sorted(absorbed, key=lambda i: _depth(cut, i, absorbed)):
        if index in home:
            continue
        fed = [home[source] for source in sources(index) if source in home]
        if fed:
            home[index] = fed[0]
            continue
        # reads a graph input: the reader groups of it and of the absorbed nodes after it
        chain = _absorbed_after(cut, index, absorbed, users)
        readers = sorted({home[user] for member in chain for user in users(member) if user in home})
        first = next((g for g in readers if not any(
            _feeds(cut, merged[h], merged[g]) or _path_outside(cut, merged[h], merged[g]) for h in readers if h != g)),
            None)
        for member in chain:
            if first is not None:
                home[member] = first
    for index, number in home.items():
        merged[number].add(index)
    return merged


def _depth(cut: GraphCut, index: int, absorbed: set[int]) -> int:
    """How many absorbed nodes come before ``index`` on its way back to a moved node or an input."""
    depth, current = 0, index
    while True:
        before = [cut.producer[name] for name in cut.reads[current] if name in cut.producer
                  and cut.producer[name] in absorbed]
        if not before:
            return depth
        depth, current = depth + 1, before[0]


def _absorbed_after(cut: GraphCut, index: int, absorbed: set[int], users) -> list[int]:
    """``index`` and the absorbed nodes that read it, transitively."""
    chain, stack = [], [index]
    while stack:
        current = stack.pop()
        if current in chain:
            continue
        chain.append(current)
        stack.extend(user for user in users(current) if user in absorbed)
    return chain


def _merge_adjacent(cut: GraphCut, groups: list[set[int]]) -> list[set[int]]:
    """Groups where one reads what the other makes become one (one If, not an If feeding an If:
    two Ifs in a row made QNN's capability invalid, measured), unless a node outside both lies
    on a path between them (one If would then wait on its own output)."""
    merged = [set(group) for group in groups]
    changed = True
    while changed:
        changed = False
        for first in range(len(merged)):
            for second in range(len(merged)):
                if first == second or not _feeds(cut, merged[first], merged[second]):
                    continue
                if _path_outside(cut, merged[first], merged[second]):
                    continue
                merged[first] = merged[first] | merged[second]
                del merged[second]
                changed = True
                break
            if changed:
                break
    return merged


def _feeds(cut: GraphCut, source: set[int], target: set[int]) -> bool:
    return any(user in target for i in source for name in cut.nodes[i].output if name
               for user in cut.consumers.get(name, []))


def _path_outside(cut: GraphCut, source: set[int], target: set[int]) -> bool:
    """Does a node outside both groups read (transitively) what ``source`` makes and feed ``target``?"""
    both = source | target
    frontier = [user for i in source for name in cut.nodes[i].output if name for user in cut.consumers.get(name, [])
                if user not in both]
    seen: set[int] = set()
    while frontier:
        index = frontier.pop()
        if index in seen:
            continue
        seen.add(index)
        for name in cut.nodes[index].output:
            for user in cut.consumers.get(name, []) if name else []:
                if user in target:
                    return True
                if user not in both:
                    frontier.append(user)
    return False


def _exclusive_constant_work(cut: GraphCut, members: set[int]) -> set[int]:
    """Constant work read only by ``members`` (or by such constant work): it moves with them."""
    moved: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index in cut.free - moved:
            users = [user for name in cut.nodes[index].output if name for user in cut.consumers.get(name, [])]
            outputs = [name for name in cut.nodes[index].output if name]
            if users and all(user in members or user in moved for user in users) and not any(
                    name in cut.graph_outputs for name in outputs):
                moved.add(index)
                changed = True
    return moved


def _rename_outer_reads(node, renamed: dict[str, str]) -> None:
    """Values a control-flow node's subgraphs read from outside, renamed like the rest."""
    if not renamed:
        return
    for _, subgraph in subgraphs_of(node):
        for inner in subgraph.node:
            inner.input[:] = [renamed.get(name, name) for name in inner.input]
            _rename_outer_reads(inner, renamed)


def _condition_source(cut: GraphCut, proto, order: list[int], group: set[int]) -> str:
    """The value an If's condition is computed from: a float tensor the unit reads from outside;
    for a quantized one, the float value its QuantizeLinear quantized (QNN fails to create a Cast
    from uint16, and the unsupported Cast made its capability invalid); else a float graph input;
    else any tensor the unit reads (cast to float)."""
    from onnx import TensorProto

    def elem_type(name: str) -> int:
        value = cut.types.get(name)
        if value is None or not value.type.HasField("tensor_type"):
            return TensorProto.UNDEFINED
        return value.type.tensor_type.elem_type

    read = [name for index in order for name in cut.reads[index] if name not in cut.initializers
            and not (cut.producer.get(name) is not None and cut.producer[name] in group)]
    float_types = (TensorProto.FLOAT, TensorProto.FLOAT16)
    for name in read:
        if elem_type(name) in float_types:
            return name
        source = cut.producer.get(name)
        if source is not None and cut.nodes[source].op_type == "QuantizeLinear":
            before = cut.nodes[source].input[0]
            if elem_type(before) in float_types:
                return before
    inputs = [v.name for v in proto.graph.input if v.name not in cut.initializers]
    for name in inputs:
        if elem_type(name) in float_types:
            return name
    for name in read + inputs:
        if elem_type(name) not in (TensorProto.UNDEFINED, TensorProto.STRING):
            return name
    raise CutError("no tensor to compute the If's condition from")


def _condition(cut: GraphCut, source: str, used: set[str], nodes: list) -> str:
    """A bool scalar ORT cannot fold, from ``source`` (Cast to float where it is not, ReduceMax
    over everything, IsNaN, Not), appended to ``nodes``; returns its name."""
    from onnx import TensorProto, helper

    value = cut.types.get(source)
    if value is None or value.type.tensor_type.elem_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
        as_float = fresh_name(f"{OFF_EP_PREFIX}_float", used)
        nodes.append(helper.make_node("Cast", [source], [as_float], to=TensorProto.FLOAT, name=as_float))
        source = as_float
    largest, is_nan, cond = (fresh_name(f"{OFF_EP_PREFIX}_{part}", used) for part in ("max", "isnan", "cond"))
    nodes.extend([helper.make_node("ReduceMax", [source], [largest], keepdims=0, name=largest),
                  helper.make_node("IsNaN", [largest], [is_nan], name=is_nan),
                  helper.make_node("Not", [is_nan], [cond], name=cond)])
    return cond
