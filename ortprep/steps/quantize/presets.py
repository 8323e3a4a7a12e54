"""The quantizer's settings: each EP's quantization preset, and the user's overrides applied to it.

The presets themselves are data in ``ortprep/eps/data/eps.json`` (each with its source), read
through ``ortprep.eps.registry``; this module names what they may hold and resolves one of them
into the settings a quantizer run takes. No graph work and no processes here.
"""

from __future__ import annotations

from typing import Any

from ortprep.eps.registry import EPS, QuantizePreset, resolve_ep
from ortprep.errors import UsageError
from ortprep.options import QuantizeOptions

FORMATS = ("qdq", "qoperator")
# the types the quantizer's child maps to ORT's QuantType (the Quantize request, ortprep.runtime.requests.quantize)
QUANT_TYPES = ("int8", "uint8", "int16", "uint16")


def presets() -> dict[str, QuantizePreset]:
    """EP name -> its quantization preset, for every EP that has one."""
    return {spec.name: spec.quantize for spec in EPS if spec.quantize is not None}


def resolve_settings(options: QuantizeOptions) -> dict[str, Any]:
    """The EP's preset with the explicit overrides applied."""
    spec = resolve_ep(options.ep)
    preset = spec.quantize
    if preset is None:
        raise UsageError(f"no quantization preset for '{options.ep}'")
    settings = {
        "preset": spec.name,
        "preset_reason": preset.reason,
        "preset_source": preset.source,
        "requires_static_shapes": preset.requires_static_shapes,
        "format": options.format or preset.format,
        "per_channel": preset.per_channel if options.per_channel is None else options.per_channel,
        "weight_type": options.weight_type or preset.weight_type,
        "activation_type": options.activation_type or preset.activation_type,
        "method": options.method,
        "extra_options": {"ActivationSymmetric": True, "WeightSymmetric": True} if preset.symmetric else {},
        "op_types": None,
        # ops whose output encoding the EP fixes (QNN's 16-bit Sigmoid/Tanh): written into the model so that
        # the graph's own DequantizeLinear agrees with what the EP computes
        "fixed_output_encodings": {op: list(by_type[activation]) for op,
                                   by_type in (preset.fixed_output_encodings or {}).items()
                                   if (activation := options.activation_type or preset.activation_type) in by_type},
    }
    # U8S8 on an x86-64 CPU without VNNI: ORT's int8 kernels saturate there (runtime/cpu.py), so the
    # model would compute otherwise on this CPU than the gate can vouch for: 7-bit weights, as ORT documents.
    from ortprep.runtime.cpu import int8_saturates

    settings["reduce_range"] = bool(spec.name == "cpu" and settings["activation_type"] == "uint8"
                                    and settings["weight_type"] == "int8" and int8_saturates())
    if options.mode == "weight-only":
        # block-wise MatMul weights, float activations (ORT's MatMulNBits): no calibration, no preset types
        settings.update(format="qoperator", per_channel=False, weight_type=options.weight_only or "int4",
                        activation_type="float", extra_options={}, op_types=["MatMul"], fixed_output_encodings={},
                        reduce_range=False, weight_bits=options.weight_only or "int4", block_size=options.block_size,
                        symmetric=options.symmetric, requires_static_shapes=False,
                        rounding="gptq" if options.rounding == "gptq" else "nearest",
                        # the CPU EP's int8 kernel for MatMulNBits (4); elsewhere the attribute stays unset, as
                        # ORT's quantizer leaves it (most EPs do not read it)
                        accuracy_level=(int(options.accuracy_level) if options.accuracy_level != "auto"
                                        else 4 if spec.name == "cpu" else 0))
        return settings
    if options.mode == "dynamic":
        if settings["format"] == "qdq" and options.format is None:
            settings["format"] = "qoperator"  # dynamic quantization writes QOperator-style ops
        if preset.dynamic_op_types:
            # e.g. ConvInteger has no GPU kernels: keep dynamic quantization to MatMul-style ops.
            settings["op_types"] = list(preset.dynamic_op_types)
    return settings


def quantizer_op_types(mode: str, quant_format: str) -> list[str]:
    """Every op type ORT's quantizer knows how to quantize in this mode and format (what it
    quantizes when the settings name no op types)."""
    if mode == "weight-only":
        return ["MatMul"]
    from ortprep.runtime.quantizer_ops import registry_op_types

    return registry_op_types(mode, quant_format)
