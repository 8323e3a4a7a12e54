"""Mutated models for robustness runs (`tools/fuzz.py --mode bytes`): byte flips, truncation and a
few structural mutations of a seed model; the protobuf-field mutations are tools/fuzz_fields.py.

Used by tests/test_fuzz.py (a bounded run in make test) and tools/fuzz.py; a test
fixture, so it lives in tools/, not in the installed package. Each
case is deterministic from (seed model, case number), so a failing case can be replayed.
"""

from __future__ import annotations

import random

import onnx
from onnx import TensorProto, helper

MUTATIONS = (
    "flip_bytes", "truncate", "negative_dim", "huge_dim", "external_offset", "huge_tensor", "cycle",
    "duplicate_name", "dangling_input", "wrong_attribute_type", "unknown_domain", "nonsense_opset",
    "bytes_domain", "empty_graph", "duplicate_opset",
)


def mutate(seed_bytes: bytes, case: int) -> tuple[str, bytes]:
    """(mutation name, model bytes) for case number ``case`` of a seed model."""
    rng = random.Random(case)
    kind = MUTATIONS[case % len(MUTATIONS)]
    if kind == "flip_bytes":
        data = bytearray(seed_bytes)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return kind, bytes(data)
    if kind == "truncate":
        return kind, seed_bytes[: rng.randrange(1, len(seed_bytes))]
    model = onnx.load_from_string(seed_bytes)
    graph = model.graph
    nodes = list(graph.node)
    if kind == "negative_dim" and graph.input:
        dims = graph.input[0].type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = -rng.randint(1, 10)
    elif kind == "huge_dim" and graph.input:
        dims = graph.input[0].type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = 2**40
    elif kind == "external_offset" and graph.initializer:
        tensor = graph.initializer[rng.randrange(len(graph.initializer))]
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", "weights.bin"), ("offset", str(2**40)), ("length", str(2**33))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
    elif kind == "huge_tensor" and graph.initializer:
        tensor = graph.initializer[rng.randrange(len(graph.initializer))]
        del tensor.dims[:]
        tensor.dims.extend([2**20, 2**20])
    elif kind == "cycle" and len(nodes) >= 2:
        first, last = graph.node[0], graph.node[len(nodes) - 1]
        if last.output and first.input:
            first.input[0] = last.output[0]
    elif kind == "duplicate_name" and len(nodes) >= 2:
        graph.node[1].output[0] = graph.node[0].output[0]
    elif kind == "dangling_input" and nodes:
        graph.node[rng.randrange(len(nodes))].input.append("nowhere_" + str(case))
    elif kind == "wrong_attribute_type" and nodes:
        node = graph.node[rng.randrange(len(nodes))]
        node.attribute.append(helper.make_attribute("axis" if node.attribute else "alpha", "not-a-number"))
    elif kind == "unknown_domain" and nodes:
        graph.node[rng.randrange(len(nodes))].domain = "com.example.unknown"
    elif kind == "nonsense_opset":
        model.opset_import[0].version = rng.choice([0, -3, 999, 2**31 - 1])
    elif kind == "bytes_domain":
        entry = model.opset_import.add()
        entry.domain = "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")
        entry.version = 1
    elif kind == "empty_graph":
        del graph.node[:]
    elif kind == "duplicate_opset":
        entry = model.opset_import.add()
        entry.domain = ""
        entry.version = model.opset_import[0].version - 1 or 1
    return kind, model.SerializeToString()
