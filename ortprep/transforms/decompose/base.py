"""What a decomposition is: the op it replaces, the ops it produces, the opsets it needs, and a
builder that writes one node's replacement through an Emitter (which names the new nodes after the
original and makes constants in the node's own float type)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class Decomposition:
    """One rewrite. ``opsets``: the ai.onnx opset range it is written for (inclusive; None: open);
    ``build(node, emit)`` emits the replacement and returns True, or False where this node's form
    (its attributes, an unknown rank) is not one it handles; the node then stays as it is."""

    name: str
    op: str
    produces: tuple[str, ...]
    opsets: tuple[int, int | None]
    build: Callable[[NodeProto, Emitter], bool]
    summary: str
    domain: str = ""

    def fits(self, opset: int) -> bool:
        low, high = self.opsets
        return opset >= low and (high is None or opset <= high)

    def record(self) -> dict:
        return {"name": self.name, "op": f"{self.domain}:{self.op}" if self.domain else self.op,
                "produces": list(self.produces), "opsets": [self.opsets[0], self.opsets[1]], "summary": self.summary}


@dataclass
class TensorFacts:
    """What shape inference knows of a tensor: its element type and shape (None: unknown; a dim
    that is not a number is None)."""

    elem_type: int = TensorProto.FLOAT
    shape: list[int | None] | None = None


@dataclass
class Emitter:
    """Collects one node's replacement: nodes named ``<original>.<n>`` (so a placement report can
    tell which original each came from) and constant initializers in the node's float type."""

    original: NodeProto
    label: str
    opset: int
    facts: Callable[[str], TensorFacts]
    values: Callable[[str], np.ndarray | None] = lambda name: None  # a constant input's value, else None
    nodes: list[NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)

    @property
    def dtype(self) -> np.dtype:
        return helper.tensor_dtype_to_np_dtype(self.facts(self.original.input[0]).elem_type)

    def const(self, value, dtype=None) -> str:
        """A constant initializer (float in the node's type unless ``dtype``)."""
        array = np.asarray(value, dtype=dtype or self.dtype)
        name = f"{self.label}.c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        """Emit ``op``; returns its (first) output: ``out`` where given (the original's output)."""
        name = f"{self.label}.{len(self.nodes)}.{op}"
        output = out or f"{name}.out"
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    def reduce_mean(self, data: str, axes: list[int], out: str | None = None) -> str:
        """ReduceMean over ``axes`` (keepdims): an attribute before opset 18, an input from it."""
        if self.opset >= 18:
            return self.node("ReduceMean", [data, self.const(axes, np.int64)], out, keepdims=1)
        return self.node("ReduceMean", [data], out, axes=axes, keepdims=1)

    def clip01(self, data: str, out: str | None = None) -> str:
        """Clip to [0, 1] (min and max inputs: opset 11 on)."""
        return self.node("Clip", [data, self.const(0.0), self.const(1.0)], out)


def attr(node: NodeProto, name: str, default):
    """A node attribute's value (float, int, string or ints), else ``default``."""
    for item in node.attribute:
        if item.name == name:
            value = helper.get_attribute_value(item)
            return value.decode() if isinstance(value, bytes) else value
    return default


def is_float(elem_type: int) -> bool:
    return elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


def schema_since(op: str, opset: int, domain: str = "") -> int | None:
    """The since_version of ``op``'s schema at ``opset``, or None where onnx has none."""
    try:
        return onnx.defs.get_schema(op, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None
