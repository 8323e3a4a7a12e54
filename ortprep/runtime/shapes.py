"""ONNX Runtime's symbolic shape inference, for the values onnx's own inference cannot type."""

from __future__ import annotations

import logging

from onnx import ModelProto

from ortprep.analysis import skeleton

log = logging.getLogger(__name__)


def symbolic_infer(proto: ModelProto) -> ModelProto | None:
    """ONNX Runtime's symbolic shape inference, which knows ORT's contrib ops (com.microsoft) that
    onnx cannot type. It needs sympy, which ortprep does not require: None without it, or when it
    fails."""
    try:
        import sympy  # noqa: F401
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        log.info("symbolic shape inference unavailable (needs onnxruntime and sympy)")
        return None
    try:
        # Its infer_shapes() saves the model it could not finish to ./sym_shape_infer_temp.onnx (and
        # a data file beside it) in the current folder, the user's: its steps are run here instead,
        # and an incomplete inference is simply not used.
        inference = SymbolicShapeInference(2**31 - 1, True, True, 0)
        if not all(hasattr(inference, name) for name in ("_preprocess", "_infer_impl", "_update_output_from_vi")):
            return None  # another ORT release's internals: no symbolic inference rather than files in the cwd
        inference._preprocess(skeleton(proto))
        complete = False
        while inference.run_:
            complete = inference._infer_impl()
        inference._update_output_from_vi()
        if not complete:
            log.info("symbolic shape inference incomplete")
            return None
        return inference.out_mp_
    except Exception as exc:  # noqa: BLE001 - it raises many types on models it cannot follow
        log.info("symbolic shape inference failed: %s", exc)
        return None
