"""ortprep quantize MODEL --static --calib DIR | --dynamic"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import FailOn, FailOnOpt, ForceOpt, JsonOpt, KeepFailedOpt, ModelArg, OutputOpt, ReportOpt
from ortprep.cli.output import check_report_path, emit, progress_bar, write_report
from ortprep.errors import ExitCode, UsageError


class QuantEp(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    dml = "dml"
    qnn = "qnn"
    tensorrt = "tensorrt"
    openvino = "openvino"


class Format(str, Enum):
    qdq = "qdq"
    qoperator = "qoperator"


class Method(str, Enum):
    minmax = "minmax"
    entropy = "entropy"
    percentile = "percentile"


class WeightType(str, Enum):
    int8 = "int8"
    uint8 = "uint8"


class ActivationType(str, Enum):
    uint8 = "uint8"
    int8 = "int8"
    uint16 = "uint16"


def _floats(text: str | None, what: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"bad {what} '{text}'", hint="write numbers separated by commas, e.g. 0.485,0.456,0.406") from None


@error_boundary
def quantize_command(
    model: ModelArg,
    static: Annotated[bool, typer.Option("--static", help="Static quantization with calibration data.")] = False,
    dynamic: Annotated[bool, typer.Option("--dynamic", help="Dynamic quantization (weights only, activations at run time).")] = False,
    output: OutputOpt = None,
    calib: Annotated[str | None, typer.Option("--calib", help="Calibration data: folder of .npz/.npy/images, a stacked .npz, or 'random'.", show_default=False)] = None,
    eval_data: Annotated[str | None, typer.Option("--eval", help="Evaluation data (same forms as --calib); default: every fifth calibration sample, held back.", show_default=False)] = None,
    ep: Annotated[QuantEp, typer.Option("--ep", help="Target EP: sets the preset (format, types, per-channel).")] = QuantEp.cpu,
    quant_format: Annotated[Format | None, typer.Option("--format", help="Override the preset's format.", show_default=False)] = None,
    per_channel: Annotated[bool | None, typer.Option("--per-channel/--per-tensor", help="Override the preset's weight granularity.", show_default=False)] = None,
    method: Annotated[Method, typer.Option("--method", help="Calibration method.")] = Method.minmax,
    weight_type: Annotated[WeightType | None, typer.Option("--weight-type", show_default=False)] = None,
    activation_type: Annotated[ActivationType | None, typer.Option("--activation-type", show_default=False)] = None,
    exclude_op: Annotated[list[str] | None, typer.Option("--exclude-op", help="Op type to leave in float (repeatable).", show_default=False)] = None,
    exclude_node: Annotated[list[str] | None, typer.Option("--exclude-node", help="Node to leave in float (repeatable).", show_default=False)] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Use at most this many calibration samples.", show_default=False, min=1)] = None,
    preprocess: Annotated[bool, typer.Option("--preprocess/--no-preprocess", help="ORT's quantization pre-processing first.")] = True,
    image_size: Annotated[str | None, typer.Option("--image-size", help="Image calibration: H,W.", show_default=False)] = None,
    mean: Annotated[str | None, typer.Option("--mean", help="Image calibration: per-channel mean (after scaling to 0..1).", show_default=False)] = None,
    std: Annotated[str | None, typer.Option("--std", help="Image calibration: per-channel std.", show_default=False)] = None,
    layout: Annotated[str, typer.Option("--layout", help="Image calibration: nchw or nhwc.")] = "nchw",
    min_cosine: Annotated[float, typer.Option("--min-cosine", help="Accuracy gate: lowest cosine per output on held-back samples.")] = 0.99,
    auto_exclude: Annotated[bool, typer.Option("--auto-exclude", help="Keep the nodes where the error starts in float and re-quantize until the gate passes.")] = False,
    keep_failed: KeepFailedOpt = False,
    force: ForceOpt = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """Quantize with real calibration data, an EP preset and an accuracy verdict."""
    from ortprep.model import ModelHandle
    from ortprep.render.console import render_quantize
    from ortprep.runtime.calibration import ImageOptions
    from ortprep.runtime.providers import require_ort
    from ortprep.steps.quantize import QuantizeOptions, quantize_model

    if static == dynamic:
        raise UsageError("choose one of --static or --dynamic", hint="e.g. ortprep quantize MODEL --static --calib data/")
    if layout not in ("nchw", "nhwc"):
        raise UsageError(f"bad --layout '{layout}'", hint="use nchw or nhwc")
    size = _floats(image_size, "--image-size")
    image = ImageOptions(
        size=(int(size[0]), int(size[1])) if size and len(size) == 2 else None,
        mean=_floats(mean, "--mean") or (0.0, 0.0, 0.0),
        std=_floats(std, "--std") or (1.0, 1.0, 1.0),
        layout=layout,
    )
    options = QuantizeOptions(
        mode="static" if static else "dynamic",
        calib=calib,
        eval=eval_data,
        ep=ep.value,
        format=quant_format.value if quant_format else None,
        per_channel=per_channel,
        method=method.value,
        weight_type=weight_type.value if weight_type else None,
        activation_type=activation_type.value if activation_type else None,
        exclude_ops=tuple(exclude_op or ()),
        exclude_nodes=tuple(exclude_node or ()),
        samples=samples,
        preprocess=preprocess,
        image=image,
        min_cosine=min_cosine,
        auto_exclude=auto_exclude,
        keep_failed=keep_failed,
        force=force,
    )
    report_path = check_report_path(report, model)
    require_ort()
    handle = ModelHandle.open(model)
    with progress_bar(quiet=json_output) as progress:
        step = quantize_model(handle, output, options, progress=progress)
    record = step.to_record()
    write_report(report_path, record)
    emit(record, as_json=json_output, human=render_quantize)
    if step.fails(fail_on.severity()):
        raise typer.Exit(int(ExitCode.GATE_FAILED))


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_command)
