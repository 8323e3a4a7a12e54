"""ortprep package, and load --package: one model's variants per target, in ORT's model package
layout, and the variant ORT picks for each EP here, proven."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from ortprep.cli.boundary import error_boundary
from ortprep.cli.options import JsonOpt, ReportOpt


@error_boundary
def package_command(
    model: Annotated[Path, typer.Argument(help="The ONNX model file (float).", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="The package folder to write (must not exist, unless "
                                         "--force).", show_default=False)],
    targets: Annotated[list[str] | None, typer.Option(
        "--target", help="A target EP, optionally named: EP or NAME=EP (repeatable), e.g. cpu, cuda, qnn.",
        show_default=False)] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Take the targets from this ortprep.toml's [targets] "
                                                "(their ep, device and runtime).", show_default=False)] = None,
    calib: Annotated[str | None, typer.Option("--calib", help="Calibration data for quantized targets (qnn): a folder "
                                              "of .npz/.npy samples or images.", show_default=False)] = None,
    inputs: Annotated[Path | None, typer.Option("--inputs", help="Verify and load on these inputs (.npz, one array "
                                                "per input).", show_default=False)] = None,
    shapes: Annotated[list[str] | None, typer.Option("--shape", help="Shape of a symbolic input: NAME=DIMS "
                                                     "(repeatable).", show_default=False)] = None,
    metrics: Annotated[list[str] | None, typer.Option("--metric", help="What the application reads from an output: "
                                                      "OUTPUT=KIND (see quantize --help).", show_default=False)] = None,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Quantized targets' accuracy gate (see "
                                                     "quantize --min-cosine).", show_default=False)] = None,
    device: Annotated[str | None, typer.Option("--device", help="The device QNN targets are for (a SoC name or "
                                               "soc_model=N).", show_default=False)] = None,
    runtimes: Annotated[list[str] | None, typer.Option("--runtime", help="Prove an EP under another environment's "
                                                       "Python: EP=PYTHON (repeatable), e.g. openvino-cpu=.venv-openvino/bin/python.",
                                                       show_default=False)] = None,
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help="Also compile an EPContext variant for QNN "
                                           "targets (where QNN runs here).")] = True,
    name: Annotated[str | None, typer.Option("--name", help="Package name (default: the model's).", show_default=False)] = None,
    version: Annotated[str | None, typer.Option("--version", help="Package version.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing package at -o.")] = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
) -> None:
    """Write one variant per target (FP16, QDQ, EPContext), each proven, in ORT's model package layout."""
    from ortprep.cli.output import check_report_paths, emit, progress_bar
    from ortprep.model import atomic_write_bytes
    from ortprep.packaging import PackageOptions, build_package, targets_from
    from ortprep.render.json import dumps
    from ortprep.render.package import render_package

    check_report_paths([report], model)
    values = {"shapes": _parsed("shapes", shapes), "metrics": _parsed("metrics", metrics)}
    chosen = targets_from(targets or [], config=config, device=device, runtimes=_parsed_runtimes(runtimes))
    options = PackageOptions(targets=chosen, calib=calib, inputs=inputs,
                             shapes=values["shapes"], metrics=values["metrics"], min_cosine=min_cosine, compile=compile_, name=name,
                             version=version, force=force)
    with progress_bar(quiet=json_output) as progress:
        result = build_package(model, output, options, progress=progress)
    document = result.document()
    if report is not None:
        atomic_write_bytes(report, dumps(document).encode("utf-8"))
    emit(document, as_json=json_output, human=render_package)
    raise typer.Exit(result.exit_code())


def _parsed(key: str, given: list[str] | None) -> Any:
    """--shape / --metric parsed as quantize parses them (one grammar)."""
    from ortprep.options import QuantizeOptions, VerifyOptions, convert_value

    owner = VerifyOptions if key == "shapes" else QuantizeOptions
    field = next(f for f in owner.fields() if f.name == key)
    return convert_value(field, given, "package", None) if given else {}


def _parsed_runtimes(given: list[str] | None) -> dict[str, Path]:
    """--runtime EP=PYTHON, parsed as load parses it (canonical EP names)."""
    from ortprep.options import LoadOptions, convert_value

    if not given:
        return {}
    field = next(f for f in LoadOptions.fields() if f.name == "runtimes")
    return {name: Path(python) for name, python in convert_value(field, given, "package", None).items()}


PACKAGE_PARAMETER = inspect.Parameter("package", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=typer.Option(
    None, "--package", help="Load a model package instead of a model: for each EP here, the variant ONNX Runtime picks, "
    "run on that EP against the package's float variant.", show_default=False))


def load_package_hook(kwargs: dict[str, Any]) -> bool:
    """load --package answers on its own (the model argument is then not given)."""
    package = kwargs.pop("package", None)
    if package is None:
        if kwargs.get("model") is None:
            from ortprep.errors import UsageError

            raise UsageError("load needs a model, or --package DIR", hint="usage: ortprep load MODEL [--ep EP]")
        return False
    from ortprep.cli.commands import option_values
    from ortprep.cli.output import check_report_paths, emit, progress_for
    from ortprep.errors import UsageError
    from ortprep.model import atomic_write_bytes
    from ortprep.options import LoadOptions
    from ortprep.packaging import load_package
    from ortprep.render.json import dumps
    from ortprep.render.package import render_package_load

    if kwargs.get("model") is not None:
        raise UsageError("load takes a model or --package, not both", hint="drop the model argument")
    if kwargs.get("reference"):
        raise UsageError("load --package compares with the package's own float variant", hint="drop --reference")
    values = option_values(LoadOptions, kwargs)
    LoadOptions.from_values(values, where="load")  # the same validation as a plain load
    check_report_paths([kwargs.get("report")], None)
    with progress_for("loading the package's variants", quiet=kwargs["json_output"]):
        result = load_package(Path(package), values)
    document = result.document()
    if kwargs.get("report") is not None:
        atomic_write_bytes(kwargs["report"], dumps(document).encode("utf-8"))
    emit(document, as_json=kwargs["json_output"], human=render_package_load)
    if result.exit_code():
        raise typer.Exit(result.exit_code())
    return True


def register(app: typer.Typer) -> None:
    app.command("package")(package_command)
