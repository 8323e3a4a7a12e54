"""ortprep package, and load --package: one model's variants per target, in ORT's model package
layout, and the variant ORT picks for each EP here, proven."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from ortprep.cli.boundary import error_boundary
from ortprep.cli.options import JsonOpt, ReportOpt


def _package(
    model: Annotated[Path, typer.Argument(help="The ONNX model file (float).", show_default=False,
                                                metavar="MODEL")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The package folder to write (must not exist, unless "
                                         "--force).", show_default=False, metavar="DIR")],
    targets: Annotated[list[str] | None, typer.Option(
        "--target", help="A target EP, optionally named: EP or NAME=EP (repeatable), e.g. cpu, cuda, qnn.",
        show_default=False, metavar="EP")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Take the targets from this ortprep.toml's [targets] "
                                                "(their ep, device and runtime).", show_default=False,
                                                metavar="CONFIG")] = None,
    inputs: Annotated[Path | None, typer.Option("--inputs", help="Verify and load on these inputs (.npz, one array "
                                                "per input).", show_default=False,
                                                metavar="FILE")] = None,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Quantized targets' accuracy gate (see "
                                                     "quantize --min-cosine).", show_default=False,
                                                     metavar="X")] = None,
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help="Also compile an EPContext variant for QNN "
                                           "targets (where QNN runs here).")] = True,
    name: Annotated[str | None, typer.Option("--name", help="Package name (default: the model's).",
                                             show_default=False, metavar="NAME")] = None,
    version: Annotated[str | None, typer.Option("--version", help="Package version.", show_default=False,
                                                metavar="VERSION")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing package at -o.")] = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
) -> None:
    """package's own options, as parameters (package_command's signature reads them from here)."""


def package_command(**given: Any) -> None:
    """Write one variant per target (FP16, QDQ, EPContext), each proven, in ORT's model package layout."""
    from ortprep.cli.commands import option_values
    from ortprep.cli.output import check_report_paths, emit, progress_bar
    from ortprep.model import atomic_write_bytes
    from ortprep.options.package import PackageSharedOptions
    from ortprep.packaging import PackageOptions, build_package, targets_from
    from ortprep.render.json import dumps
    from ortprep.render.package import render_package

    model, report, json_output = given["model"], given.get("report"), given.get("json_output", False)
    check_report_paths([report], model)
    shared = PackageSharedOptions.from_values(option_values(PackageSharedOptions, given), where="package")
    chosen = targets_from(given.get("targets") or [], config=given.get("config"), device=shared.device,
                          runtimes=shared.runtimes)
    options = PackageOptions(targets=chosen, calib=shared.calib, inputs=given.get("inputs"), shapes=shared.shapes,
                             metrics=shared.metrics, min_cosine=given.get("min_cosine"),
                             compile=given.get("compile_", True), name=given.get("name"),
                             version=given.get("version"), force=given.get("force", False))
    with progress_bar(quiet=json_output) as progress:
        result = build_package(model, given["output"], options, progress=progress)
    document = result.document()
    if report is not None:
        atomic_write_bytes(report, dumps(document).encode("utf-8"))
    emit(document, as_json=json_output, human=render_package)
    raise typer.Exit(result.exit_code())


def _package_signature() -> inspect.Signature:
    """package's own options (from _package) and, where they stood, those it shares with the steps
    (built from the same groups, by the same code as a step command's)."""
    from ortprep.cli.commands import option_parameters
    from ortprep.options.package import PackageSharedOptions

    own = {p.name: p for p in inspect.signature(_package, eval_str=True).parameters.values()}
    by_name = {name: (p if name == "model" else p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
               for name, p in own.items()}
    by_name.update({p.name: p for p in option_parameters(PackageSharedOptions)})
    order = ["model", "output", "targets", "config", "calib", "inputs", "shapes", "metrics", "min_cosine", "device",
             "runtimes", "compile_", "name", "version", "force", "json_output", "report"]
    return inspect.Signature([by_name[name] for name in order])


package_command.__signature__ = _package_signature()  # type: ignore[attr-defined]
package_command = error_boundary(package_command)


PACKAGE_PARAMETER = inspect.Parameter(
    "package", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=typer.Option(
        None, "--package", help="Load a model package instead of a model: for each EP here, the variant ONNX Runtime "
        "picks, run on that EP against the package's float variant.", show_default=False,
        metavar="DIR"))


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
