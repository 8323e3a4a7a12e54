"""Patterns measured to fail a whole session on an EP, which no single-op probe shows: the EP
takes each node alone, and the session of the model still is not created. Each rule stands on
whole-model sessions (tools/probe_sessions.py writes them to data/measured/sessions.json; the
rule names its cases) and on real models (bench/suite/journey.py). A match is finding EP009 (error) and
the verdict "none"."""

from __future__ import annotations

from dataclasses import dataclass

from ortprep.analysis import ModelAnalysis

SESSIONS = "eps/data/measured/sessions.json (tools/probe_sessions.py), 2026-11-24"
OPENVINO_SOURCE = (f"measured with onnxruntime-openvino 1.24.1, CPU device: cases loop_conv_body, loop_add_body, "
                   f"loop_then_relu of {SESSIONS}, and bench/suite/journey.py's control-flow classifier")
QNN_SOURCE = (f"measured with onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0, HTP simulator, soc_model 60: case "
              f"qdq_dynamic_batch of {SESSIONS}")


@dataclass(frozen=True)
class SessionFailure:
    what: str  # what the model has, in words
    message: str  # the EP's own words, as measured
    nodes: tuple[str, ...]  # the nodes that make it
    source: str
    fix: str


def session_failures(analysis: ModelAnalysis, ep: str, on_ep: list[bool]) -> list[SessionFailure]:
    """The measured session failures that ``analysis``'s model meets on ``ep`` (an EP name of the
    tables). ``on_ep[i]``: whether the prediction puts node i of ``analysis.all_nodes()`` on the EP."""
    if ep.startswith("openvino"):
        return _openvino_loop(analysis, ep)
    if ep == "qnn":
        return _qnn_without_inputs(analysis, on_ep)
    return []


def _openvino_loop(analysis: ModelAnalysis, ep: str) -> list[SessionFailure]:
    """A Loop anywhere in the model: OpenVINO's ONNX frontend fails to read the subgraph that holds
    it ("OpenVINO does not support the following ONNX operations: com.intel.ai.OpenVINO-EP-
    subgraph_1"), or a Conv after it gets an input of unknown rank ("The input data tensor's rank
    has to be known (static)"). Measured on the CPU device with a Loop over a Conv block, over an
    Add, and followed by a Relu only: the session fails in all three."""
    loops = tuple(node.name for node in analysis.all_nodes() if node.op_type == "Loop")
    if not loops:
        return []
    device = ep.partition("-")[2] or "CPU"
    return [SessionFailure(
        what=f"a Loop ({', '.join(loops[:3])})", nodes=loops, source=OPENVINO_SOURCE,
        message="OpenVINO does not support the following ONNX operations: com.intel.ai.OpenVINO-EP-subgraph_N",
        fix=f"unroll the Loop when its trip count is fixed (re-export without the loop), or run the model on the CPU "
            f"EP; measured on OpenVINO's CPU device ({device.upper()} was not measured)")]


def _qnn_without_inputs(analysis: ModelAnalysis, on_ep: list[bool]) -> list[SessionFailure]:
    """Every node QNN would take reads only initializers (a QDQ model whose activations have a
    dynamic dim: QNN rejects each node with a dynamic tensor and keeps only the weights'
    DequantizeLinear): QNN's graph then has no input, and the session fails ("Having zero graph
    inputs is not supported on this backend")."""
    nodes = analysis.all_nodes()
    taken = [node for node, on in zip(nodes, on_ep) if on and node.graph_id == 0]
    if not taken:
        return []
    made = {out for node in taken for out in node.node.output if out}
    reads_data = any(value is not None and not value.is_initializer and name not in made
                     for node in taken for name, value in zip(node.node.input, node.inputs) if name)
    if reads_data:
        return []
    return [SessionFailure(
        what=f"{len(taken)} node(s) on QNN that read only initializers ({', '.join(n.name for n in taken[:3])})",
        nodes=tuple(n.name for n in taken), source=QNN_SOURCE,
        message="Having zero graph inputs is not supported on this backend",
        fix="make the inputs static so that QNN takes the model's nodes: ortprep convert MODEL --fix-dim NAME=VALUE "
            "(or --fix-shape), then quantize again")]
