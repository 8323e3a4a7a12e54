"""ortprep convert MODEL --fp16 | --opset N | --fix-shape ... | --fix-dim ... | --conv1d-to-conv2d"""

from __future__ import annotations

from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import (
    FailOn,
    FailOnOpt,
    ForceOpt,
    InputsOpt,
    JsonOpt,
    KeepFailedOpt,
    ModelArg,
    OutputOpt,
    ReportOpt,
    ShapeOpt,
    VerifyOpt,
)
from ortprep.cli.output import run_transform

Repeat = list[str] | None


@error_boundary
def convert_command(
    model: ModelArg,
    output: OutputOpt = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="Convert float32 to float16, verified, with mixed precision where needed.")] = False,
    ep: Annotated[str, typer.Option("--ep", help="Target EP: ops it has no FP16 kernel for stay FP32.")] = "cpu",
    keep_io_types: Annotated[
        bool | None,
        typer.Option("--keep-io-types/--fp16-io", help="Keep float32 inputs/outputs (default), or make them float16 (default for dml-npu).", show_default=False),
    ] = None,
    block_op: Annotated[Repeat, typer.Option("--block-op", help="Op type to keep in FP32 (repeatable).", show_default=False)] = None,
    block_node: Annotated[Repeat, typer.Option("--block-node", help="Node name to keep in FP32 (repeatable).", show_default=False)] = None,
    opset: Annotated[int | None, typer.Option("--opset", help="Convert to this opset (onnx version converter).", show_default=False)] = None,
    fix_shape: Annotated[Repeat, typer.Option("--fix-shape", help="Make an input static: NAME=1,3,224,224 (repeatable).", show_default=False)] = None,
    fix_dim: Annotated[Repeat, typer.Option("--fix-dim", help="Fix a named symbolic dimension: batch=1 (repeatable).", show_default=False)] = None,
    conv1d_to_conv2d: Annotated[bool, typer.Option("--conv1d-to-conv2d", help="Rewrite 1-D Conv/ConvTranspose/pooling as 2-D.")] = False,
    shape: ShapeOpt = None,
    inputs: InputsOpt = None,
    min_cosine: Annotated[float, typer.Option("--min-cosine", help="FP16 gate: lowest cosine similarity per output.")] = 0.999,
    verify: VerifyOpt = True,
    keep_failed: KeepFailedOpt = False,
    force: ForceOpt = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """Transform a model (FP16, opset, static shapes, 1-D to 2-D) and verify the result."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.feeds import parse_assignments, parse_dims
    from ortprep.steps.convert import ConvertOptions, convert_model

    def positive_int(name: str, value: str) -> int:
        if not value.isdigit() or int(value) <= 0:
            from ortprep.errors import UsageError

            raise UsageError(f"bad --fix-dim value '{name}={value}'", hint="give a positive integer, e.g. batch=1")
        return int(value)

    options = ConvertOptions(
        fp16=fp16,
        ep=resolve_ep(ep).name,
        keep_io_types=keep_io_types,
        block_ops=tuple(block_op or ()),
        block_nodes=tuple(block_node or ()),
        opset=opset,
        fix_shapes={k: parse_dims(v) for k, v in parse_assignments(fix_shape, "--fix-shape").items()},
        fix_dims={k: positive_int(k, v) for k, v in parse_assignments(fix_dim, "--fix-dim").items()},
        conv1d_to_conv2d=conv1d_to_conv2d,
        shapes={k: parse_dims(v) for k, v in parse_assignments(shape, "--shape").items()},
        inputs=inputs,
        min_cosine=min_cosine,
        verify=verify,
        keep_failed=keep_failed,
        force=force,
    )
    run_transform(
        lambda handle: convert_model(handle, output, options)[0],
        model,
        verify=verify,
        report=report,
        json_output=json_output,
        fail_on=fail_on,
        label="converting",
    )


def register(app: typer.Typer) -> None:
    app.command("convert")(convert_command)
