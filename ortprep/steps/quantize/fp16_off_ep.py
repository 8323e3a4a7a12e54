"""FP16 with one op kept off the target EP, where quantize's FP16 probe passes on the CPU EP and
fails on the EP alone (``quantize --auto --auto-exclude``): the EP computes some op of the float
model otherwise (QNN's HTP: ddddocr's 11 Sigmoids in FP16, for a cause not found), and no
precision mends that; keeping the op's nodes on the CPU EP does.

Each op type of the model in turn, all its nodes kept off the EP (in If nodes the CPU EP runs,
as ``convert --keep-off-ep``), converted as the printed command converts it and judged by the
probe's own gate on both EPs; the first that passes is named, with its command. The order: ops an
NPU computes by approximation (sigmoid, exp, log, ...) first, then by fewest nodes; an op type over
MOVE_SHARE of the compute nodes, or with an unnamed node, is not tried (the EP is meant to run most
of the model). Bound by the step's time. Measurement: docs/decisions/mend52-fp16-off-ep.md.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from ortprep.options import ConvertOptions
from ortprep.runtime.budget import step_spent

# Elementwise functions an NPU computes by approximation (tables, polynomials), where float's
# arithmetic ops (Conv, MatMul, Add) round once: the likelier to be computed otherwise.
APPROXIMATED = frozenset({"Sigmoid", "Tanh", "Exp", "Log", "Softmax", "LogSoftmax", "Erf", "Pow", "Sqrt",
                          "Reciprocal", "HardSigmoid", "HardSwish", "Gelu", "Elu", "Selu", "Softplus", "Mish",
                          "Sin", "Cos"})
# Ops that move or relabel values (their error is their input's): never a set of their own.
NOT_MOVED = frozenset({"Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Constant",
                       "Shape", "Gather", "Slice", "Concat", "Split", "Expand", "QuantizeLinear", "DequantizeLinear"})
# An op type with more than this share of the compute nodes is not kept off: the EP would run
# too little of the model for it to be the EP's deployment.
MOVE_SHARE = 0.25
# At most this many op types are tried (each is a conversion and a judgement on the EP).
MAX_SETS = 6


def op_sets(proto: onnx.ModelProto) -> list[tuple[str, list[str]]]:
    """(op type, its main-graph node names) in the order they are tried (see the module's docstring)."""
    compute = [node for node in proto.graph.node if node.op_type not in NOT_MOVED]
    by_op: dict[str, list] = {}
    for node in compute:
        by_op.setdefault(node.op_type, []).append(node)
    sets = [(op, [node.name for node in nodes]) for op, nodes in by_op.items()
            if all(node.name for node in nodes) and len(nodes) <= MOVE_SHARE * len(compute)]
    return sorted(sets, key=lambda item: (item[0] not in APPROXIMATED, len(item[1]), item[0]))[:MAX_SETS]


def keep_off_command(command: str, names: list[str]) -> str:
    """The probe's convert command with each of ``names`` kept off the EP (before its ``-o``),
    read and written as shell words (a path may hold " -o ")."""
    words = shlex.split(command)
    at = len(words) - 1 - words[::-1].index("-o")
    return shlex.join(words[:at] + [w for name in names for w in ("--keep-off-ep", name)] + words[at:])


def mend(source: Path, scratch: Path, base: ConvertOptions, convert: Callable[[Path, Path, ConvertOptions], Any],
         judge: Callable[[Path], Any]) -> tuple[Any, list[str], list[dict[str, Any]], Path | None]:
    """Try each op set of ``source`` (the float model) kept off the EP: ``convert(source, dest,
    options)`` writes the FP16 file as the command does (None where it refuses), ``judge(path)`` its
    evaluation by the probe's gate. Returns (the passing evaluation or None, its nodes, every try,
    the file judged to pass or None)."""
    tried: list[dict[str, Any]] = []
    for index, (op, names) in enumerate(op_sets(onnx.load(str(source), load_external_data=False))):
        if step_spent("FP16 kept off the EP"):
            tried.append({"op": op, "nodes": len(names), "passed": None, "reason": "the step's time was spent"})
            break
        dest = scratch / f"fp16-off-{index}.onnx"
        written = convert(source, dest, dataclasses.replace(base, keep_off_ep=tuple(names)))
        if written is None:
            tried.append({"op": op, "nodes": len(names), "passed": None, "reason": "convert refused it"})
            continue
        evaluation = judge(dest)
        entry = {"op": op, "nodes": len(names), "passed": bool(evaluation.passed), "cosine": evaluation.gate_cosine,
                 "failed_on": evaluation.failed_on}
        tried.append(entry)
        if evaluation.passed:
            return evaluation, names, tried, dest
    return None, [], tried, None
