"""Float patterns measured to fail a QNN session on particular devices (SoCs), so that `check`
predicts them without a session. Each pattern is matched on the model's nodes; the devices and
the measurement are in ``data/devices.json`` (``measured_failures``), with their source."""

from __future__ import annotations

from collections.abc import Callable

from ortprep.analysis import ModelAnalysis, NodeInfo
from ortprep.eps.devices import Device, device_facts


def _depthwise_unequal_strides(graph, node: NodeInfo, read_by_mul: set[str]) -> bool:
    """A grouped Conv whose group is its input's channel count (when known), strides unequal."""
    if node.op_type != "Conv":
        return False
    group, strides = node.attribute("group", 1), list(node.attribute("strides", []) or [])
    if group <= 1 or len(set(strides)) < 2:
        return False
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    return not (shape and len(shape) > 1 and isinstance(shape[1], int) and shape[1] != group)


def _reducesum_into_mul(graph, node: NodeInfo, read_by_mul: set[str]) -> bool:
    return node.op_type == "ReduceSum" and any(name in read_by_mul for name in node.node.output)


PATTERNS: dict[str, Callable[..., bool]] = {
    "depthwise_unequal_strides": _depthwise_unequal_strides,
    "reducesum_into_mul": _reducesum_into_mul,
}


def failing_patterns(analysis: ModelAnalysis, device: Device) -> list[tuple[NodeInfo, dict]]:
    """(node, the measured failure it matches) for every node of the main graph that matches a
    pattern measured to fail on ``device``'s SoC."""
    facts = device_facts().get(device.ep, {})
    soc = int(device.provider_options.get("soc_model", "0") or 0)
    found = []
    for failure in facts.get("measured_failures", []):
        if soc not in failure["soc_models"]:
            continue
        matches = PATTERNS[failure["pattern"]]
        graph = analysis.graphs[0]
        read_by_mul = {name for other in graph.nodes if other.op_type == "Mul" for name in other.node.input}
        for node in graph.nodes:
            if matches(graph, node, read_by_mul):
                found.append(
                    (node, {**failure, "source": device_facts()["sources"].get(failure["source"], failure["source"])})
                )
    return found
