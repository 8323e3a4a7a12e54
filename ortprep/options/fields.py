"""Step options as data: one definition gives the command-line flags, the config keys, the help
text, the validation and the config a command line writes out (``--emit-config``).

Each step's ``Options`` is a dataclass whose fields are made with :func:`option`. A field's
``kind`` says how a value is read from the command line (strings) and from a TOML config (typed
values); both paths end in the same :meth:`StepOptions.from_values`, so the command line and the
config file accept and refuse the same things.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ortprep.errors import UsageError


class Kind(str, Enum):
    """How a field is spelled on the command line and in a config file."""

    FLAG = "flag"  # bool: --name/--no-name; true/false
    TRISTATE = "tristate"  # bool | None: --on/--off, unset means "the step decides"
    INT = "int"
    FLOAT = "float"
    TEXT = "text"  # str; with choices, one of them
    PATH = "path"  # a file or folder; relative paths in a config are relative to the config
    DATA = "data"  # a path, or the word "random"
    EP = "ep"  # one EP name or alias, stored as its canonical name
    EP_LIST = "ep_list"  # EP names (repeatable), stored as canonical names
    TARGETS = "targets"  # EP targets; a comma list is one session's priority list
    NAMES = "names"  # repeatable strings
    SHAPES = "shapes"  # NAME=1,3,224,224 (repeatable) / { NAME = [1, 3, 224, 224] }
    DIMS = "dims"  # NAME=1 (repeatable) / { NAME = 1 }
    FLOATS = "floats"  # 0.5,0.5,0.5 / [0.5, 0.5, 0.5]
    PROVIDER_OPTIONS = "provider_options"  # EP:KEY=VALUE (repeatable) / { EP = { KEY = "VALUE" } }
    RUNTIMES = "runtimes"  # EP=PYTHON (repeatable) / { EP = "env/bin/python" }: where an EP's ORT lives
    METRICS = "metrics"  # OUTPUT=KIND (repeatable) / { OUTPUT = "KIND" }: an output's decision metric


@dataclass(frozen=True)
class OptionSpec:
    help: str
    kind: Kind
    flags: tuple[str, ...] = ()  # command-line spellings; default --field-name
    off_flag: str | None = None  # the negative flag of FLAG/TRISTATE; default --no-field-name
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # numbers: the smallest value allowed
    cli: bool = True  # False: config and Python only
    shortcuts: tuple[tuple[str, str], ...] = ()  # extra flags that set a TEXT field to one value (--static)
    metavar: str | None = None


def option(default: Any, help: str, kind: Kind, **spec: Any) -> Any:
    """A dataclass field carrying its command-line and config definition."""
    meta = {"ortprep": OptionSpec(help=help, kind=kind, **spec)}
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spec_of(field: dataclasses.Field) -> OptionSpec:
    return field.metadata["ortprep"]


def default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def cli_flags(field: dataclasses.Field) -> list[str]:
    """The command-line spellings of a field: its own flags, and always the config key in kebab case."""
    spec = spec_of(field)
    own = "--" + field.name.replace("_", "-")
    flags = list(spec.flags) or [own]
    if own not in flags:
        flags.append(own)
    return flags


def off_flag(field: dataclasses.Field) -> str:
    """The negative flag of a FLAG/TRISTATE field."""
    return spec_of(field).off_flag or "--no-" + field.name.replace("_", "-")


# --- reading one value -------------------------------------------------------------------------


def _bad(where: str, key: str, value: Any, expected: str) -> UsageError:
    return UsageError(f"{where}: {key} = {value!r} is not {expected}", hint=f"give {key} as {expected}")


def _int(where: str, key: str, value: Any, *, positive: bool = False) -> int:
    if isinstance(value, bool):
        raise _bad(where, key, value, "an integer")
    if isinstance(value, str):
        text = value.strip()
        if not text.lstrip("-").isdigit():
            raise _bad(where, key, value, "a positive integer" if positive else "an integer")
        value = int(text)
    if not isinstance(value, int):
        raise _bad(where, key, value, "an integer")
    if positive and value <= 0:
        raise _bad(where, key, value, "a positive integer")
    return value


def _float(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise _bad(where, key, value, "a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _bad(where, key, value, "a number") from None
    if not math.isfinite(number):
        raise _bad(where, key, value, "a finite number")
    return number


def _assignments(where: str, key: str, value: Any, example: str) -> dict[str, Any]:
    """NAME=VALUE strings (command line) or a table (config) -> dict."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise _bad(where, key, value, f"a table or NAME=VALUE strings like {example}")
    result: dict[str, Any] = {}
    for item in value:
        name, eq, rhs = str(item).partition("=")
        if not eq or not name.strip() or not rhs.strip():
            raise UsageError(f"{where}: bad {key} value '{item}'", hint=f"write it as NAME=VALUE, e.g. {example}")
        result[name.strip()] = rhs.strip()
    return result


def _names(where: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise _bad(where, key, value, "a list of names")
    return tuple(value)


def convert_value(field: dataclasses.Field, value: Any, where: str, base: Path | None) -> Any:
    """One option's value, from the command line or a config, as the Options field holds it."""
    spec = spec_of(field)
    key = field.name
    kind = spec.kind
    if value is None:
        return None
    if kind in (Kind.FLAG, Kind.TRISTATE):
        if not isinstance(value, bool):
            raise _bad(where, key, value, "true or false")
        return value
    if kind == Kind.INT:
        number = _int(where, key, value)
        if spec.minimum is not None and number < spec.minimum:
            raise _bad(where, key, value, f"an integer of at least {spec.minimum:g}")
        return number
    if kind == Kind.FLOAT:
        number = _float(where, key, value)
        if spec.minimum is not None and number < spec.minimum:
            raise _bad(where, key, value, f"a number of at least {spec.minimum:g}")
        return number
    if kind == Kind.TEXT:
        if isinstance(value, Enum):
            value = value.value
        if not isinstance(value, str):
            raise _bad(where, key, value, "a string")
        if spec.choices and value.lower() not in spec.choices:
            raise UsageError(f"{where}: {key} = {value!r} is not valid", hint="use one of: " + ", ".join(spec.choices))
        return value.lower() if spec.choices else value
    if kind in (Kind.PATH, Kind.DATA):
        if not isinstance(value, (str, Path)) or not str(value):
            raise _bad(where, key, value, "a path")
        if kind == Kind.DATA and str(value) == "random":
            return "random"
        path = Path(value)
        return (base / path).resolve() if base is not None and not path.is_absolute() else path
    if kind == Kind.EP:
        from ortprep.eps.registry import resolve_ep

        if not isinstance(value, str):
            raise _bad(where, key, value, "an EP name")
        return _in_context(where, lambda: resolve_ep(value).name)
    if kind == Kind.EP_LIST:
        from ortprep.eps.registry import resolve_ep

        names = _names(where, key, value)
        resolved = [_in_context(where, lambda text=text: resolve_ep(text).name) for text in names]
        return list(dict.fromkeys(resolved))
    if kind == Kind.TARGETS:
        from ortprep.eps.registry import resolve_target

        names = _names(where, key, value)
        return [_in_context(where, lambda text=text: ",".join(s.name for s in resolve_target(text))) for text in names]
    if kind == Kind.NAMES:
        return _names(where, key, value)
    if kind == Kind.SHAPES:
        shapes = {}
        for name, dims in _assignments(where, key, value, "x=1,3,224,224").items():
            if isinstance(dims, str):
                dims = [d for d in dims.replace("x", ",").split(",") if d.strip()]
            if not isinstance(dims, (list, tuple)) or not dims:
                raise _bad(where, f"{key}.{name}", dims, "a list of positive integers")
            for d in dims:
                if isinstance(d, str) and d.strip()[:1].isalpha():
                    # check's fix writes a dim it cannot know as a placeholder (SAMPLES, STATE_DIM1)
                    raise UsageError(f"{where}: {key}.{name}: {d.strip()!r} stands for a size of yours, not a number",
                                     hint="put the size you deploy with in its place (a positive integer)")
            shapes[name] = [_int(where, f"{key}.{name}", d, positive=True) for d in dims]
        return shapes
    if kind == Kind.DIMS:
        return {name: _int(where, f"{key}.{name}", v, positive=True)
                for name, v in _assignments(where, key, value, "batch=1").items()}
    if kind == Kind.FLOATS:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise _bad(where, key, value, "numbers separated by commas")
        return tuple(_float(where, key, v) for v in items)
    if kind == Kind.PROVIDER_OPTIONS:
        return _provider_options(where, key, value)
    if kind == Kind.METRICS:
        from ortprep.fidelity.decisions import parse_metric

        metrics = {}
        for name, text in _assignments(where, key, value, "logits=top1").items():
            try:
                parse_metric(str(text))
            except ValueError as exc:
                raise UsageError(f"{where}: {key}.{name}: {exc}", hint="e.g. --metric logits=top1, --metric "
                                 "prob_map=map:0.3, --metric hidden=cosine") from None
            metrics[name] = str(text).strip().lower()
        return metrics
    if kind == Kind.RUNTIMES:
        from ortprep.eps.registry import resolve_ep

        runtimes = {}
        for ep, python in _assignments(where, key, value, "openvino-cpu=.venv-openvino/bin/python").items():
            name = _in_context(where, lambda ep=ep: resolve_ep(ep).name)
            path = Path(str(python))
            path = (base / path) if base is not None and not path.is_absolute() else path
            if not path.is_file():
                raise UsageError(f"{where}: {key}.{name}: no Python interpreter at {path}",
                                 hint="give the python of an environment with that EP's ONNX Runtime, e.g. "
                                      "ENV/bin/python")
            runtimes[name] = Path(os.path.abspath(path))
        return runtimes
    raise AssertionError(f"unhandled option kind {kind}")


def _in_context(where: str, resolve):
    try:
        return resolve()
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", hint=exc.hint) from None


def _provider_options(where: str, key: str, value: Any) -> dict[str, dict[str, str]]:
    from ortprep.eps.registry import resolve_ep

    result: dict[str, dict[str, str]] = {}
    if isinstance(value, dict):
        for ep, table in value.items():
            if not isinstance(table, dict):
                raise _bad(where, f"{key}.{ep}", table, "a table of KEY = \"VALUE\"")
            ep_name = _in_context(where, lambda ep=ep: resolve_ep(ep).name)
            result.setdefault(ep_name, {}).update({str(k): str(v) for k, v in table.items()})
        return result
    for item in _names(where, key, value):
        ep, sep, assignment = item.partition(":")
        name, eq, text = assignment.partition("=")
        if not sep or not eq or not name:
            raise UsageError(f"{where}: bad {key} value '{item}'",
                             hint="write it as EP:KEY=VALUE, e.g. cuda:device_id=0")
        ep_name = _in_context(where, lambda ep=ep: resolve_ep(ep).name)
        result.setdefault(ep_name, {})[name] = text
    return result


# --- writing a value back out (for --emit-config) ------------------------------------------------


def config_value(field: dataclasses.Field, value: Any, base: Path) -> Any:
    """The TOML form of a field's value; paths relative to ``base`` where they can be."""
    if isinstance(value, Path):
        return relative_path(value, base)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: (relative_path(v, base) if isinstance(v, Path) else v) for k, v in value.items()}
    return value


def relative_path(path: Path, base: Path) -> str:
    import os

    absolute = Path(os.path.abspath(path))
    try:
        return os.path.relpath(absolute, base)
    except ValueError:  # another drive on Windows
        return str(absolute)


@dataclass
class StepOptions:
    """Base of every step's Options. Subclasses are dataclasses of :func:`option` fields and may
    override :meth:`validate` for checks that involve several fields."""

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if "ortprep" in f.metadata]

    @classmethod
    def from_values(cls, values: dict[str, Any], *, where: str, base: Path | None = None) -> "StepOptions":
        """Build and validate from command-line or config values (unknown keys are refused)."""
        known = {f.name: f for f in cls.fields()}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UsageError(
                f"{where}: unknown option(s) {', '.join(unknown)}",
                hint="valid options: " + ", ".join(sorted(known)),
            )
        converted = {name: convert_value(known[name], value, where, base) for name, value in values.items()
                     if value is not None}
        options = cls(**converted)
        options.validate(where)
        return options

    def validate(self, where: str) -> None:
        """Checks that involve more than one field; raise UsageError naming the keys."""

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults."""
        return {f.name: getattr(self, f.name) for f in self.fields() if getattr(self, f.name) != default_of(f)}

    def to_config(self, base: Path) -> dict[str, Any]:
        """The config keys that reproduce these options (defaults left out)."""
        known = {f.name: f for f in self.fields()}
        return {name: config_value(known[name], value, base) for name, value in self.changed().items()}
