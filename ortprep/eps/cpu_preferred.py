"""Nodes ORT itself moves from a kernel EP to the CPU: small shape computations.

The CUDA EP (and ORT's WebGPU and CANN EPs; not TensorRT or the compiling EPs) hands the nodes it
has kernels for to ORT's GetCpuPreferredNodes (onnxruntime/core/framework/fallback_cpu_capability.cc)
and gives up the ones it returns. The rule, as that function applies it:

- start from the consumers of tensors that are in CPU memory: the outputs of the EP's Shape and
  Size kernels (their output is declared in CPU memory), and of nodes that run on the CPU anyway;
- visit them in topological order; a node the EP claimed goes to the CPU when every input is a
  small initializer (at most 100 elements), a graph input, or a tensor already in CPU memory that
  the EP's kernel does not itself take in CPU memory (Reshape's shape, Slice's starts, Range's
  bounds: those stay where they are and the node stays on the EP); no input may be float16,
  bfloat16 or float8;
- a node moved so puts its outputs in CPU memory, and its consumers become candidates in turn.

Measured on a real GPU (bench/studies/gpu_weight_only.sh, onnxruntime-gpu 1.31.1 on an H200, RESULTS.md
"CUDA and TensorRT on a real GPU"): in a GPT-2-like decoder, the Gather that reads the sequence
length from Shape and the Concat of two such lengths ran on the CPU while check had them on CUDA.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from importlib import resources

from ortprep.analysis import NodeInfo

PREFERRING_EPS = frozenset({"cuda"})


def _facts() -> dict:
    return json.loads(resources.files("ortprep.eps").joinpath("data/cuda_cpu_memory.json").read_text(encoding="utf-8"))


_FACTS = _facts()
SMALL_INITIALIZER = int(
    _FACTS["small_initializer_elements"]
)  # kSmallInitializerThreshold in fallback_cpu_capability.cc
NEVER_MOVED_DTYPES = frozenset(_FACTS["never_moved_dtypes"])
# Kernels of the CUDA EP whose outputs are in CPU memory, and the inputs its kernels take in CPU
# memory (a CPU tensor there does not pull the node onto the CPU): eps/data/cuda_cpu_memory.json.
CPU_OUTPUT_OPS = frozenset(_FACTS["cpu_output_ops"])
CPU_INPUTS: dict[str, frozenset[int]] = {op: frozenset(indices) for op, indices in _FACTS["cpu_inputs"].items()}


def elements(shape) -> int | None:
    if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
        return None
    count = 1
    for d in shape:
        count *= d
    return count


def cpu_preferred(nodes: Sequence[NodeInfo], claimed: Sequence[bool], on_cpu: Sequence[bool],
                  graph_inputs: set[str], constants: dict[str, int | None]) -> set[int]:
    """Positions (into ``nodes``, one graph's nodes in topological order) that ORT moves from the
    EP to the CPU. ``claimed[i]``: the EP has the node; ``on_cpu[i]``: the node runs on the CPU
    anyway; ``constants``: names ORT holds as initializers (those given and those its constant
    folding makes), with their element counts (None: unknown)."""
    consumers: dict[str, list[int]] = {}
    for position, info in enumerate(nodes):
        for name in info.node.input:
            if name:
                consumers.setdefault(name, []).append(position)
    cpu_tensors: set[str] = set()
    queue: list[int] = []

    def release(position: int) -> None:
        for name in nodes[position].node.output:
            if name:
                cpu_tensors.add(name)
                for consumer in consumers.get(name, ()):
                    heapq.heappush(queue, consumer)

    for position, info in enumerate(nodes):
        if claimed[position] and info.op_type in CPU_OUTPUT_OPS:
            release(position)
    visited: set[int] = set()
    moved: set[int] = set()
    while queue:  # in topological order, as ORT visits them
        position = heapq.heappop(queue)
        if position in visited:
            continue
        visited.add(position)
        if not claimed[position]:
            if on_cpu[position]:
                release(position)
        elif _all_inputs_on_cpu(nodes[position], cpu_tensors, graph_inputs, constants):
            moved.add(position)
            release(position)
    return moved


def _all_inputs_on_cpu(info: NodeInfo, cpu_tensors: set[str], graph_inputs: set[str],
                       constants: dict[str, int | None]) -> bool:
    kept = CPU_INPUTS.get(info.op_type, frozenset())
    for index, name in enumerate(info.node.input):
        facts = info.inputs[index] if index < len(info.inputs) else None
        if facts is not None and facts.dtype in NEVER_MOVED_DTYPES:
            return False
        if name in constants:
            count = constants[name]
            if count is not None and count <= SMALL_INITIALIZER:
                continue
        if name in graph_inputs:
            continue
        if name not in cpu_tensors or index in kept:
            return False  # on the EP, or (an absent optional input) not a CPU tensor either
    return True
