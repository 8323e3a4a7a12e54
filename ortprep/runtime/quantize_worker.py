"""Child process that quantizes with onnxruntime.quantization.

    python -m ortprep.runtime.quantize_worker REQUEST.json

It runs with a private temporary folder as its working directory, so nothing the quantizer
writes lands in the user's; a crash kills only this process. Calibration streams samples in
strides, so memory stays flat however many samples there are.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

# Calibration collects intermediate outputs for at most this many samples at a time.
MAX_STRIDE = 8


def _stride(count: int) -> int:
    return max(d for d in range(1, min(MAX_STRIDE, count) + 1) if count % d == 0)


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
        if self.progress_path:
            # The parent polls this file to draw its progress bar.
            with open(self.progress_path, "w", encoding="utf-8") as out:
                out.write(f"{self.read} {len(self.indices)}")
        return sample

    def rewind(self) -> None:
        self.position = self.window[0]


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    status: dict = {"ok": False}
    logging.basicConfig(level=logging.ERROR)
    try:
        os.chdir(request["workdir"])
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_dynamic,
            quantize_static,
        )

        from ortprep.runtime.calibration import CalibrationSet

        options = request["options"]
        types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16, "uint16": QuantType.QUInt16}
        common = dict(
            op_types_to_quantize=options.get("op_types") or None,
            per_channel=options.get("per_channel", False),
            weight_type=types[options.get("weight_type", "int8")],
            nodes_to_exclude=options.get("exclude_nodes") or None,
            use_external_data_format=options.get("external_data", False),
            extra_options=options.get("extra_options") or {},
        )
        if request["mode"] == "preprocess":
            from onnxruntime.quantization.preprocess import quant_pre_process

            quant_pre_process(request["model"], request["output"], skip_symbolic_shape=not options["symbolic"],
                              save_as_external_data=options["external_data"])
        elif request["mode"] == "dynamic":
            quantize_dynamic(request["model"], request["output"], **common)
        else:
            calibration = CalibrationSet.from_json(request["calibration"])
            reader = StreamingReader(calibration, request["calibration_indices"], request.get("progress"))
            extra = dict(common.pop("extra_options"))
            extra["CalibStridedMinMax"] = _stride(len(reader))
            methods = {
                "minmax": CalibrationMethod.MinMax,
                "entropy": CalibrationMethod.Entropy,
                "percentile": CalibrationMethod.Percentile,
            }
            quantize_static(
                request["model"],
                request["output"],
                reader,
                quant_format=QuantFormat.QDQ if options["format"] == "qdq" else QuantFormat.QOperator,
                activation_type=types[options["activation_type"]],
                calibrate_method=methods[options["method"]],
                extra_options=extra,
                **common,
            )
        status["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        status["error"] = " ".join(str(exc).split()) or type(exc).__name__
        status["type"] = type(exc).__name__
        status["traceback"] = traceback.format_exc()[-2000:]
    with open(request["status"], "w", encoding="utf-8") as out:
        json.dump(status, out)
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its result goes back through the status file
