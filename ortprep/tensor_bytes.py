"""Do a stored tensor's bytes fit its shape and element type? onnx's checker catches data that is
too short, not data that is too long, nor external-data entries that disagree with the shape; a
step that decodes such a tensor (numpy's frombuffer, a reshape) then fails deep inside. The model
gate (``ModelHandle.open``) asks ``tensor_defect`` of every stored tensor and refuses the file in
one line. Sizes come from dims, types and metadata: external data is never read here
(docs/decisions/docs-tensor-bytes-gate.md).
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto

SUB_BYTE_BITS = {
    getattr(TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(TensorProto, name)
}
# Types whose storage onnx has not settled across versions: their sizes are not judged here.
_UNJUDGED = {getattr(TensorProto, name) for name in ("FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, name)}
_KNOWN_TYPES = frozenset(TensorProto.DataType.values())

# The typed field holding each element type, and how many entries one element takes there.
_TYPED_FIELD = {
    TensorProto.FLOAT: ("float_data", 1),
    TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1),
    TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    TensorProto.STRING: ("string_data", 1),
}
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
# A dimension product past this is no tensor anyone stores (and keeps the arithmetic small).
_MAX_ELEMENTS = 2**62


def element_bits(elem_type: int) -> int:
    """Storage bits of one element; 0 for strings and unknown types."""
    if elem_type in SUB_BYTE_BITS:
        return SUB_BYTE_BITS[elem_type]
    if elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return 0
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize * 8
    except (KeyError, ValueError, TypeError):
        return 0


def dtype_name(elem_type: int) -> str:
    """ONNX element type code -> lower-case ONNX name ("float", "float16", "int64")."""
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"unknown({elem_type})"


def _typed_entries(elem_type: int, elements: int) -> tuple[str, int]:
    """(typed field, entries it must hold) for ``elements`` elements of ``elem_type``."""
    if elem_type in _TYPED_FIELD:
        field, per_element = _TYPED_FIELD[elem_type]
        return field, elements * per_element
    if elem_type in SUB_BYTE_BITS:  # packed: one byte of elements per int32 entry
        return "int32_data", (elements * SUB_BYTE_BITS[elem_type] + 7) // 8
    return "int32_data", elements


def tensor_defect(tensor: TensorProto) -> str | None:
    """What is wrong with a stored tensor's data for its dims and type, in a few words, or None.

    Judges inline raw bytes, the count of the typed field, and external-data entries (length and
    offset against the shape; the file itself is checked by the caller). A tensor with more than
    one value field is left to onnx's checker (ONNX Runtime reads its raw bytes)."""
    elem_type = tensor.data_type
    if elem_type not in _KNOWN_TYPES or elem_type == TensorProto.UNDEFINED:
        return f"its element type {elem_type} is not an ONNX type"
    if elem_type in _UNJUDGED:
        return None
    if any(d < 0 for d in tensor.dims):
        return f"its shape {list(tensor.dims)} has a negative dimension"
    elements = math.prod(tensor.dims) if len(tensor.dims) else 1
    if elements > _MAX_ELEMENTS:
        return f"its shape {list(tensor.dims)} has more elements than any stored tensor can"
    shape = f"shape {list(tensor.dims)} and type {dtype_name(elem_type)}"
    bits = element_bits(elem_type)
    needed = (elements * bits + 7) // 8
    if tensor.data_location == TensorProto.EXTERNAL:
        return _external_defect(tensor, needed, shape)
    if tensor.HasField("raw_data"):
        if elem_type == TensorProto.STRING:
            return "it is a string tensor with raw_data (strings are stored in string_data)"
        held = len(tensor.raw_data)
        if held != needed:
            return f"raw_data holds {held} bytes, its {shape} need {needed}"
        return None
    field, entries = _typed_entries(elem_type, elements)
    held = len(getattr(tensor, field))
    others = [name for name in _TYPED_FIELDS if name != field and len(getattr(tensor, name))]
    if others and not held:
        return f"its data is in {others[0]}, which does not hold type {dtype_name(elem_type)} (expected in {field})"
    if held != entries and not (held == 0 and elements == 0):
        if held == 0:
            return f"it holds no data, its {shape} need {entries} values"
        return f"{field} holds {held} values, its {shape} need {entries}"
    return None


def _external_defect(tensor: TensorProto, needed: int, shape: str) -> str | None:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    if tensor.data_type == TensorProto.STRING:
        return "it is a string tensor stored as external data (ONNX stores strings inline)"
    for key in ("offset", "length"):
        value = entries.get(key)
        if value is not None and value != "" and not (value.isascii() and value.isdigit()):
            return f"its external-data {key} '{value[:40]}' is not a byte count"
    length = entries.get("length")
    if length and int(length) != needed:
        return f"its external-data length is {int(length)} bytes, its {shape} need {needed}"
    return None
