"""Step commands built from the steps' Options definitions.

Each field of a step's Options becomes one command-line option (its help, flags, choices and
default come from the field), so the command line, the config file and the docs say the same
thing. Every command then builds a one-step pipeline and goes through ``run_and_render``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from ortprep.cli.boundary import error_boundary
from ortprep.cli.options import FAIL_ON_METAVAR, FailOn
from ortprep.cli.output import check_report_paths, execute
from ortprep.options import Kind, cli_flags, default_of, off_flag, spec_of

METAVARS = {Kind.INT: "N", Kind.FLOAT: "X", Kind.PATH: "FILE", Kind.DATA: "DATA", Kind.EP: "EP", Kind.TEXT: "TEXT",
            Kind.NAMES: "NAME", Kind.FLOATS: "X,Y,..."}


def _enum(name: str, choices: tuple[str, ...]) -> type[Enum]:
    return Enum(name, {choice: choice for choice in choices}, type=str)  # type: ignore[return-value]


def _parameter(field: dataclasses.Field) -> inspect.Parameter:
    """One Typer parameter for an Options field. Values arrive as strings (or bools) and are
    converted by the same code that reads config files."""
    spec = spec_of(field)
    default = default_of(field)
    flags = cli_flags(field)
    common: dict[str, Any] = {"help": spec.help, "show_default": False}
    metavar = spec.metavar or ("|".join(spec.choices) if spec.choices else METAVARS.get(spec.kind))
    if metavar:
        common["metavar"] = metavar
    if spec.kind in (Kind.FLAG, Kind.TRISTATE):
        off = off_flag(field)
        declarations = [f"{flags[0]}/{off}"] + [f for f in flags[1:]]
        if spec.kind == Kind.FLAG:
            common["show_default"] = flags[0] if default else off
        return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[bool],
                                 default=typer.Option(None, *declarations, **common))
    annotation: Any
    if spec.kind in (Kind.NAMES, Kind.TARGETS, Kind.EP_LIST, Kind.SHAPES, Kind.DIMS, Kind.PROVIDER_OPTIONS,
                     Kind.RUNTIMES, Kind.METRICS):
        annotation = Optional[list[str]]
    elif spec.kind == Kind.TEXT and spec.choices:
        annotation = Optional[_enum(field.name.title().replace("_", ""), spec.choices)]
        common["case_sensitive"] = False
        if default is not None:
            common["show_default"] = str(default)
    else:
        annotation = Optional[str]
        if default not in (None, (), [], {}):
            common["show_default"] = str(default)
    return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(None, *flags, **common))


def _shortcut_parameters(field: dataclasses.Field) -> list[inspect.Parameter]:
    spec = spec_of(field)
    return [
        inspect.Parameter(f"_{field.name}_{value}", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, flag, help=f"Same as --{field.name.replace('_', '-')} {value}."))
        for flag, value in spec.shortcuts
    ]


def _common_parameters(name: str, writes_model: bool, needs_model: bool,
                       optional_model: bool) -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = []
    if needs_model:
        default = typer.Argument(None if optional_model else ..., help="The ONNX model file.", show_default=False,
                                 metavar="MODEL")
        params.append(inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=Optional[Path] if optional_model else Path, default=default))
    if writes_model:
        params.append(inspect.Parameter("output", kw, annotation=Optional[Path], default=typer.Option(
            None, "-o", "--output", help="Output model (default: beside the input, with a suffix).",
                  show_default=False, metavar="FILE")))
        params.append(inspect.Parameter("force", kw, annotation=bool, default=typer.Option(
            False, "--force", help="Allow the output to overwrite the input model.")))
    params += [
        inspect.Parameter("json_output", kw, annotation=bool, default=typer.Option(
            False, "--json", help="Print the report as JSON (the only thing on stdout).")),
        inspect.Parameter("report", kw, annotation=Optional[Path], default=typer.Option(
            None, "--report", help="Also write the JSON report to this file (atomically).", show_default=False,
            metavar="FILE")),
        inspect.Parameter("junit", kw, annotation=Optional[Path], default=typer.Option(
            None, "--junit", help="Also write a JUnit XML report here.", show_default=False, metavar="FILE")),
        inspect.Parameter("markdown", kw, annotation=Optional[Path], default=typer.Option(
            None, "--markdown", help="Also write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).",
                  show_default=False, metavar="FILE")),
        inspect.Parameter("fail_on", kw, annotation=FailOn, default=typer.Option(
            FailOn.error, "--fail-on", help="Exit 1 when a finding is at or above this severity.",
                          case_sensitive=False, metavar=FAIL_ON_METAVAR)),
        inspect.Parameter("emit_config", kw, annotation=Optional[Path], default=typer.Option(
            None, "--emit-config", help="Write the ortprep.toml equivalent to this command line to FILE and exit "
            "(ortprep run FILE then does the same).", show_default=False, metavar="FILE")),
    ]
    return params


def option_parameters(options_cls) -> list[inspect.Parameter]:
    """The command-line parameters of an Options class's fields (with their shortcut flags)."""
    params = []
    for field in options_cls.fields():
        if spec_of(field).cli:
            params.append(_parameter(field))
            params.extend(_shortcut_parameters(field))
    return params


def option_values(options_cls, given: dict[str, Any]) -> dict[str, Any]:
    """The values the user gave on the command line, keyed by config key (Nones dropped)."""
    values: dict[str, Any] = {}
    for field in options_cls.fields():
        spec = spec_of(field)
        value = given.get(field.name)
        for flag, choice in spec.shortcuts:
            if given.get(f"_{field.name}_{choice}"):
                if value is not None and value != choice:
                    from ortprep.errors import UsageError

                    raise UsageError(f"{flag} conflicts with {cli_flags(field)[0]} {value}", hint="choose one")
                value = choice
        if isinstance(value, Enum):
            value = value.value
        if isinstance(value, list) and not value:
            value = None
        if value is not None:
            values[field.name] = value
    return values


def build_command(name: str, *, extra: list[inspect.Parameter] = (), before=None):
    """A Typer command for step ``name``. ``before(kwargs)`` may answer the command on its own
    (e.g. ``check --list-eps``) by returning True."""
    from ortprep.steps import NO_MODEL, SUMMARIES, WRITES_MODEL, options_class

    options_cls = options_class(name)
    writes_model = name in WRITES_MODEL
    needs_model = name not in NO_MODEL
    params = _common_parameters(name, writes_model, needs_model, optional_model=before is not None)
    params[1:1] = list(extra)
    params += option_parameters(options_cls)

    def command(**kwargs: Any) -> None:

        if before is not None and before(kwargs):
            return
        run_and_render(name, options_cls, kwargs)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = f"{name}_command"
    command.__doc__ = SUMMARIES[name]
    return error_boundary(command)


def run_and_render(name: str, options_cls, given: dict[str, Any]) -> None:
    """The one path of every step command: options -> one-step pipeline -> run -> report files,
    stdout (human or JSON) and the exit code."""
    from ortprep.config import dump_toml
    from ortprep.pipeline import Pipeline

    model = given.get("model")
    options = options_cls.from_values(option_values(options_cls, given), where=name)
    pipeline = Pipeline.single(name, options, model, output=given.get("output"), fail_on=given["fail_on"].severity(),
                               force=bool(given.get("force")))
    emit_config = given.get("emit_config")
    if emit_config is not None:
        from ortprep.model import atomic_write_bytes

        check_report_paths([emit_config], model)
        atomic_write_bytes(emit_config, dump_toml(pipeline.to_config(emit_config)).encode("utf-8"))
        sys.stderr.write(f"ortprep: wrote {emit_config}; run it with: ortprep run {emit_config}\n")
        return
    code = execute(pipeline, as_json=given["json_output"], report=given.get("report"), junit=given.get("junit"),
                   markdown=given.get("markdown"))
    if code:
        raise typer.Exit(int(code))
