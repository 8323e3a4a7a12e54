"""The graph clean-ups steps share: onnxsim (constant folding, shape simplification) and
onnxoptimizer's fuse-and-eliminate passes, each returning (model or None, why not) and never
raising: a tool that cannot simplify a model is a reason, not a crash."""

from __future__ import annotations

from onnx import ModelProto

from ortprep.model import AUTO_EXTERNAL_THRESHOLD, ModelHandle, iter_nodes


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def standard_name_clash(proto: ModelProto) -> str | None:
    """A node outside ai.onnx named like a standard op but with an input count that op never
    takes, or None. onnxsim and onnxoptimizer match some patterns by op name alone, ignoring the
    domain, and read inputs the node lacks: the process dies (SIGSEGV; `make fuzz`, a one-input
    Gemm in a custom domain). Such a node is a reason to skip them, not a crash."""
    from onnx import defs

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    for _, node in iter_nodes(proto.graph):
        if node.domain in ("", "ai.onnx") or not defs.has(node.op_type):
            continue
        try:
            schema = defs.get_schema(node.op_type, max(opset, 1))
        except Exception:  # noqa: BLE001 - no such op at this opset: the name clash is the earlier one's
            schema = defs.get_schema(node.op_type)
        if not schema.min_input <= len(node.input) <= schema.max_input:
            return (f"node '{node.name or node.op_type}' in domain '{node.domain}' is named like ONNX's "
                    f"{node.op_type} but has {len(node.input)} inputs ({node.op_type} takes "
                    f"{schema.min_input}-{schema.max_input}), which onnxsim and onnxoptimizer mistake for it")
    return None


def run_onnxsim(proto: ModelProto, handle: ModelHandle) -> tuple[ModelProto | None, str]:
    """(simplified model or None, why not)."""
    if handle.estimated_size() > AUTO_EXTERNAL_THRESHOLD:
        return None, "the model is over 2 GB, which onnxsim cannot serialize"
    clash = standard_name_clash(proto)
    if clash:
        return None, clash
    try:
        import onnxsim

        simplified, ok = onnxsim.simplify(proto)
    except Exception as exc:  # noqa: BLE001 - onnxsim raises many types, all mean "could not"
        return None, f"onnxsim failed: {_first_line(exc)}"
    if not ok:
        return None, "onnxsim's own check of its result failed"
    return simplified, ""


def run_onnxoptimizer(proto: ModelProto, skip: list[str]) -> tuple[ModelProto | None, str]:
    clash = standard_name_clash(proto)
    if clash:
        return None, clash
    try:
        import onnxoptimizer

        passes = [p for p in onnxoptimizer.get_fuse_and_elimination_passes() if p not in skip]
        return onnxoptimizer.optimize(proto, passes), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"onnxoptimizer failed: {_first_line(exc)}"
