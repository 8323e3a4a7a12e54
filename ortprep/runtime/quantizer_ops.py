"""The op types ONNX Runtime's quantizer knows, read from its registries.

The one place outside the quantizer's child process that imports ``onnxruntime.quantization``:
steps ask here which ops a mode and format quantize, and whether a model has any at all.
"""

from __future__ import annotations


def registry_op_types(mode: str, quant_format: str) -> list[str]:
    """Every op type ORT's quantizer quantizes in ``mode`` ("static", "dynamic") and
    ``quant_format`` ("qdq", "qoperator") when no op types are named."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    registry = IntegerOpsRegistry if mode == "dynamic" else (QDQRegistry if quant_format == "qdq"
                                                             else QLinearOpsRegistry)
    return list(registry)


def all_registry_op_types() -> set[str]:
    """The op types of all of ORT's quantizer registries: dynamic, QDQ and QOperator."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    return set(IntegerOpsRegistry) | set(QDQRegistry) | set(QLinearOpsRegistry)
