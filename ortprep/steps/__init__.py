"""The pipeline steps, one module each, registered in one table.

Each entry names the module and class of a step; :func:`step_class` imports it only when asked,
so building the command line stays light. Helpers steps share live in ``ortprep.transforms``
and ``ortprep.runtime``, not here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ortprep.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from ortprep.options import StepOptions
    from ortprep.steps.base import Step

# name -> (module, step class, options class in ortprep.options), in pipeline order.
REGISTRY: dict[str, tuple[str, str, str]] = {
    "inspect": ("ortprep.steps.inspect", "InspectStep", "InspectOptions"),
    "check": ("ortprep.steps.check", "CheckStep", "CheckOptions"),
    "convert": ("ortprep.steps.convert", "ConvertStep", "ConvertOptions"),
    "simplify": ("ortprep.steps.simplify", "SimplifyStep", "SimplifyOptions"),
    "optimize": ("ortprep.steps.optimize", "OptimizeStep", "OptimizeOptions"),
    "quantize": ("ortprep.steps.quantize", "QuantizeStep", "QuantizeOptions"),
    "load": ("ortprep.steps.load", "LoadStep", "LoadOptions"),
    "compile": ("ortprep.steps.compile", "CompileStep", "CompileOptions"),
    "doctor": ("ortprep.steps.doctor", "DoctorStep", "DoctorOptions"),
}

# What the command line shows before the step module is imported.
SUMMARIES = {
    "inspect": "Describe a model: opsets, I/O, ops, weights, external data. Reads no weight bytes.",
    "check": "Check every node against an EP's support tables and rules: partitions, fallbacks, fixes.",
    "convert": "Transform a model (FP16, opset, static shapes, 1-D to 2-D) and verify the result.",
    "simplify": "Constant folding and graph clean-up (onnxsim + onnxoptimizer), verified with a tight tolerance.",
    "optimize": "ONNX Runtime offline graph optimization, written beside the output and verified.",
    "quantize": "Quantize with real calibration data, an EP preset and an accuracy verdict.",
    "load": "Load and run the model on each available EP: fallbacks, crashes, output match, latency.",
    "compile": "Compile an EPContext model for QNN or OpenVINO (ORT's compile API), reload it and compare outputs.",
    "doctor": "This machine's ONNX Runtime setup: packages, EPs, GPU libraries, CPU int8 support, pitfalls.",
}
WRITES_MODEL = ("convert", "simplify", "optimize", "quantize", "compile")
NO_MODEL = ("doctor",)


def _known(name: str) -> tuple[str, str, str]:
    entry = REGISTRY.get(name)
    if entry is None:
        raise UsageError(f"unknown step {name!r}", hint="use one of: " + ", ".join(REGISTRY))
    return entry


def options_class(name: str) -> type[StepOptions]:
    """The Options dataclass of a step (light: no onnx or ORT import)."""
    from ortprep import options

    return getattr(options, _known(name)[2])


def step_class(name: str) -> type[Step]:
    """The Step class of a step, importing its module."""
    module, cls, _ = _known(name)
    return getattr(importlib.import_module(module), cls)
