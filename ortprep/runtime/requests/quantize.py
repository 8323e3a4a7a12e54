"""Quantize: onnxruntime.quantization in the worker (pre-processing, dynamic, static with
calibration streamed in strides), in a private working directory for the time of the request."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState
from ortprep.runtime.requests.failure import record_failure
from ortprep.runtime.requests.sessions import (
    captured_stderr,
)

MAX_STRIDE = 8


def largest_divisor(count: int, at_most: int = MAX_STRIDE) -> int:
    """The largest divisor of ``count`` up to ``at_most``: a calibration stride ORT's strided protocol
    takes (it needs a divisor of the sample count)."""
    return max(d for d in range(1, min(at_most, count) + 1) if count % d == 0)


@contextlib.contextmanager
def calibration_in_priority_order() -> Iterator[None]:
    """Within the block, ORT's calibrators create their session with ORT's priority-based
    execution order. The MinMax calibrator adds a ReduceMin and a ReduceMax on every activation
    and makes them graph outputs; in ORT's default order (1.32) the activations of a whole sample
    then stay alive until those reductions run (docs/decisions/docs-calibration-priority-order.md).
    The order changes no value: the kernels and their inputs are the same. An ORT without
    ExecutionOrder is left as it is."""
    import onnxruntime
    from onnxruntime.quantization import calibrate

    order = getattr(getattr(onnxruntime, "ExecutionOrder", None), "PRIORITY_BASED", None)
    base = getattr(calibrate, "CalibraterBase", None)
    create = getattr(base, "create_inference_session", None)
    if order is None or create is None or getattr(calibrate, "onnxruntime", None) is not onnxruntime:
        yield
        return
    plain = onnxruntime.SessionOptions

    class Ordered(plain):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.execution_order = order

    def ordered(self, *args, **kwargs):
        # the calibrator's module builds its options as onnxruntime.SessionOptions(): for this one
        # call (the worker serves one request at a time), that name makes them priority-ordered
        onnxruntime.SessionOptions = Ordered
        try:
            return create(self, *args, **kwargs)
        finally:
            onnxruntime.SessionOptions = plain

    base.create_inference_session = ordered
    try:
        yield
    finally:
        base.create_inference_session = create


def write_progress(path: str | None, done: int, total: int) -> None:
    """``done total`` into the file the parent polls to draw its progress bar (calibrate._read_progress)."""
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(f"{done} {total}")


class StreamingReader:
    """A CalibrationDataReader over CalibrationSet samples, read one at a time; supports the
    ranges ORT's strided calibration asks for."""

    def __init__(self, calibration, indices: list[int], progress_path: str | None = None) -> None:
        self.calibration = calibration
        self.indices = indices
        self.window = (0, len(indices))
        self.position = 0
        self.progress_path = progress_path
        self.read = 0

    def __len__(self) -> int:
        return len(self.indices)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.window = (start_index, min(end_index, len(self.indices)))
        self.position = start_index

    def get_next(self):
        if self.position >= self.window[1]:
            return None
        sample = self.calibration.sample(self.indices[self.position])
        self.position += 1
        self.read += 1
        write_progress(self.progress_path, self.read, len(self.indices))
        return sample

    def rewind(self) -> None:
        self.position = self.window[0]


@dataclass
class QuantizeReply(Reply):
    error_type: str | None = None
    traceback: str | None = None
    stderr: str = ""  # what the quantizer logged (quant_pre_process reports some failures only there)


@dataclass
class Quantize(Request):
    """onnxruntime.quantization in the worker, with ``workdir`` as the working directory for the
    time of the request (nothing the quantizer writes lands in the user's). The fields are those
    of the quantize step's request: ``mode`` preprocess, dynamic or static; ``calibration`` a
    CalibrationSet's JSON; ``options`` the settings (op_types, per_channel, weight_type, ...)."""

    reply_type = QuantizeReply

    workdir: str
    model: str
    output: str
    mode: str
    options: dict[str, Any] = field(default_factory=dict)
    calibration: Any = None
    calibration_indices: list[int] | None = None
    progress: str | None = None

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Quantize:
        """From the dict the quantize step used to write as JSON for its child (its "status" is not needed)."""
        return cls(workdir=request["workdir"], model=request["model"], output=request["output"], mode=request["mode"],
                   options=request.get("options") or {}, calibration=request.get("calibration"),
                   calibration_indices=request.get("calibration_indices"), progress=request.get("progress"))

    def handle(self, state: WorkerState) -> QuantizeReply:
        import logging

        reply = QuantizeReply(status="failed", stage="quantize")
        # The sessions this worker keeps (up to MAX_SESSIONS, each with its arena at the size of its
        # largest run) are closed first: calibration builds sessions of its own, and the kept ones
        # sat beside them (docs/decisions/docs-worker-session-memory.md).
        state.sessions.clear()
        logging.basicConfig(level=logging.ERROR)
        previous = os.getcwd()
        with captured_stderr() as log:
            try:
                os.chdir(self.workdir)
                self._quantize()
                reply.status = "ok"
            except Exception as exc:  # noqa: BLE001 - reported to the parent as data
                record_failure(reply, exc)
            finally:
                os.chdir(previous)
        reply.stderr = log[0]
        return reply

    def _quantize(self) -> None:
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_dynamic,
            quantize_static,
        )

        from ortprep.runtime.calibration import CalibrationSet

        options = self.options
        types = {
            "int8": QuantType.QInt8,
            "uint8": QuantType.QUInt8,
            "int16": QuantType.QInt16,
            "uint16": QuantType.QUInt16,
        }
        if self.mode == "preprocess":
            from onnxruntime.quantization.preprocess import quant_pre_process

            quant_pre_process(self.model, self.output, skip_symbolic_shape=not options["symbolic"],
                              save_as_external_data=options["external_data"])
            return
        if self.mode == "weight-only":
            self._weight_only(options)
            return
        common = dict(
            op_types_to_quantize=options.get("op_types") or None,
            per_channel=options.get("per_channel", False),
            weight_type=types[options.get("weight_type", "int8")],
            reduce_range=bool(options.get("reduce_range", False)),  # 7-bit weights (runtime/cpu.py says when)
            nodes_to_exclude=options.get("exclude_nodes") or None,
            use_external_data_format=options.get("external_data", False),
            extra_options=options.get("extra_options") or {},
        )
        if self.mode == "dynamic":
            quantize_dynamic(self.model, self.output, **common)
            return
        calibration = CalibrationSet.from_json(self.calibration)
        reader = StreamingReader(calibration, self.calibration_indices, self.progress)
        extra = dict(common.pop("extra_options"))
        extra["CalibStridedMinMax"] = options.get("stride") or largest_divisor(len(reader))
        fixed = _fixed_encodings(
            self.model,
            options.get("fixed_output_encodings") or {},
            types[options["activation_type"]],
            set(options.get("exclude_nodes") or ()),
        )
        if fixed:
            extra["TensorQuantOverrides"] = {**fixed, **extra.get("TensorQuantOverrides", {})}
        wide = [name for name in options.get("wide_tensors") or () if name not in extra.get("TensorQuantOverrides", {})]
        if wide:
            # the search's 16-bit rung: these activations get 16-bit Q/DQ (the quantizer converts
            # between widths where a tensor's neighbours differ), the weights stay as asked
            signed = types[options["activation_type"]] in (QuantType.QInt8, QuantType.QInt16)
            width = QuantType.QInt16 if signed else QuantType.QUInt16
            extra["TensorQuantOverrides"] = {**extra.get("TensorQuantOverrides", {}),
                                             **{name: [{"quant_type": width}] for name in wide}}
        methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                   "percentile": CalibrationMethod.Percentile}
        cached = {}
        if (
            options.get("calibration_cache")
            and "calibration_cache_path" in inspect.signature(quantize_static).parameters
        ):
            # ranges measured once per source and method, reused by later trials (onnxruntime >= 1.32;
            # older releases calibrate every time)
            cached["calibration_cache_path"] = options["calibration_cache"]
        with calibration_in_priority_order():
            quantize_static(
                self.model,
                self.output,
                reader,
                quant_format=QuantFormat.QDQ if options["format"] == "qdq" else QuantFormat.QOperator,
                activation_type=types[options["activation_type"]],
                calibrate_method=methods[options["method"]],
                extra_options=extra,
                **common,
                **cached,
            )


    def _weight_only(self, options: dict[str, Any]) -> None:
        """Block-wise int4/int8 MatMul weights with ORT's MatMulNBitsQuantizer (MatMulNBits nodes)."""
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

        bits = {"int4": 4, "int8": 8}[options["weight_bits"]]
        # an empty list is --exclude-op having taken MatMul out: nothing to quantize, not the default
        op_types = tuple(options["op_types"]) if options.get("op_types") is not None else ("MatMul",)
        level = int(options.get("accuracy_level") or 0) or None  # 0: the attribute left out, as ORT's quantizer does
        config = DefaultWeightOnlyQuantConfig(block_size=options["block_size"], is_symmetric=options["symmetric"],
                                              op_types_to_quantize=op_types, bits=bits, accuracy_level=level)
        model = onnx.load(self.model)
        if options.get("rounding") == "gptq" and "MatMul" in op_types:
            # levels chosen for the layer's output on the calibration samples (runtime/rounding.py);
            # ORT's quantizer below recomputes the same grid and keeps them
            import json

            from ortprep.runtime.calibration import CalibrationSet
            from ortprep.runtime.rounding import compensate_model

            calibration = CalibrationSet.from_json(self.calibration)
            indices = list(self.calibration_indices or [])

            def samples():
                return (calibration.sample(index) for index in indices)

            done = compensate_model(model, self.model, samples, len(indices), bits, options["block_size"],
                                    options["symmetric"], set(options.get("exclude_nodes") or ()),
                                    lambda done, total: write_progress(self.progress, done, total), cache=self.workdir)
            with open(self.output + ".rounding.json", "w", encoding="utf-8") as out:
                json.dump(done, out)
        quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=options["block_size"],
                                         is_symmetric=options["symmetric"],
                                         nodes_to_exclude=list(options.get("exclude_nodes") or ()),
                                         op_types_to_quantize=op_types, algo_config=config, accuracy_level=level)
        quantizer.process()
        quantizer.model.save_model_to_file(self.output, use_external_data_format=bool(options.get("external_data")))


# --- Probe, OpProbe, Stats -------------------------------------------------------------------------


def _fixed_encodings(model_path: str, encodings: dict[str, list], quant_type, excluded: set[str]) -> dict[str, list]:
    """TensorQuantOverrides for the outputs of ops whose encoding the EP fixes (op type ->
    [scale, zero point] for this activation type), so the model's DequantizeLinear agrees with
    what the EP computes. Graph only: no weights are read."""
    if not encodings:
        return {}
    import numpy as np
    import onnx
    from onnxruntime.quantization import QuantType

    zero_type = {QuantType.QUInt16: np.uint16, QuantType.QInt16: np.int16, QuantType.QUInt8: np.uint8,
                 QuantType.QInt8: np.int8}[quant_type]
    graph = onnx.load(model_path, load_external_data=False).graph
    return {node.output[0]: [{"scale": np.array(encodings[node.op_type][0], dtype=np.float32),
                              "zero_point": np.array(encodings[node.op_type][1], dtype=zero_type)}]
            for node in graph.node if node.op_type in encodings and node.name not in excluded and node.output}

