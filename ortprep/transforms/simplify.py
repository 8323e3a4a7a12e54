"""The graph clean-ups steps share: onnxsim (constant folding, shape simplification) and
onnxoptimizer's fuse-and-eliminate passes, each returning (model or None, why not) and never
raising: a tool that cannot simplify a model is a reason, not a crash."""

from __future__ import annotations

from onnx import ModelProto

from ortprep.model import AUTO_EXTERNAL_THRESHOLD, ModelHandle


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_onnxsim(proto: ModelProto, handle: ModelHandle) -> tuple[ModelProto | None, str]:
    """(simplified model or None, why not)."""
    if handle.estimated_size() > AUTO_EXTERNAL_THRESHOLD:
        return None, "the model is over 2 GB, which onnxsim cannot serialize"
    try:
        import onnxsim

        simplified, ok = onnxsim.simplify(proto)
    except Exception as exc:  # noqa: BLE001 - onnxsim raises many types, all mean "could not"
        return None, f"onnxsim failed: {_first_line(exc)}"
    if not ok:
        return None, "onnxsim's own check of its result failed"
    return simplified, ""


def run_onnxoptimizer(proto: ModelProto, skip: list[str]) -> tuple[ModelProto | None, str]:
    try:
        import onnxoptimizer

        passes = [p for p in onnxoptimizer.get_fuse_and_elimination_passes() if p not in skip]
        return onnxoptimizer.optimize(proto, passes), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"onnxoptimizer failed: {_first_line(exc)}"
