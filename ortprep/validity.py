"""Is the model one that ONNX Runtime would load at all? onnx's full checker (structure, SSA names,
topological order, opset imports, attribute types, shape inference) is the gate every step passes
first: `check` reports a refused model as an error finding with verdict none, and the steps that
load, change or run a model stop with one line (exit 2) before doing anything."""

from __future__ import annotations

import functools

import onnx

from ortprep.errors import ModelReadError
from ortprep.model import ModelHandle


class InvalidModelError(ModelReadError):
    """A model that onnx's checker (and so ONNX Runtime) refuses."""


def checker_result(handle: ModelHandle, strict_inference_passed: bool = False) -> tuple[bool, str | None]:
    """(passed, the checker's first line) of onnx's full checker. By path when there is one: the
    C++ checker then reads the model file itself and only checks that external data files exist.

    ``strict_inference_passed``: onnx's strict, type-checking shape inference has already passed on
    the model (``ModelAnalysis.strict_inference_passed``), which is the part the full check adds
    to the plain one; the checker then runs without it."""
    return _check(str(handle.path) if handle.path is not None and handle.path.is_file() else None, handle,
                  not strict_inference_passed)


@functools.lru_cache(maxsize=32)
def _check_path(path: str, mtime: float, size: int, full_check: bool) -> tuple[bool, str | None]:
    try:
        onnx.checker.check_model(path, full_check=full_check)
    except Exception as exc:  # noqa: BLE001 - the checker raises several types
        return False, _first_line(exc)
    return True, None


def _check(path: str | None, handle: ModelHandle, full_check: bool) -> tuple[bool, str | None]:
    if path is not None:
        from pathlib import Path

        stat = Path(path).stat()
        return _check_path(path, stat.st_mtime, stat.st_size, full_check)
    try:
        onnx.checker.check_model(handle.proto, full_check=full_check)
    except Exception as exc:  # noqa: BLE001
        return False, _first_line(exc)
    return True, None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def runtime_refusal(handle: ModelHandle) -> str | None:
    """Why ONNX Runtime refuses to load the model (asked in a child process, only when onnx's
    checker has refused it already), or None when it loads. Without ORT the checker decides."""
    passed, error = checker_result(handle)
    if passed:
        return None
    if handle.path is None:
        return error
    return _ort_refusal(str(handle.path), handle.path.stat().st_mtime) and error


@functools.lru_cache(maxsize=32)
def _ort_refusal(path: str, mtime: float) -> bool:
    import tempfile
    from pathlib import Path

    from ortprep.runtime.isolated import run_isolated
    from ortprep.runtime.providers import import_ort

    if import_ort() is None:
        return True
    with tempfile.TemporaryDirectory(prefix="ortprep-validity-") as tmp:
        outcome = run_isolated(Path(path), {}, optimization="disable", optimized_model=Path(tmp) / "loaded.onnx",
                               optimized_data="loaded.onnx.data")
    return not outcome.ok


def require_valid(handle: ModelHandle, step: str) -> None:
    """Stop a step that loads, changes or runs a model that onnx's checker and ONNX Runtime both
    refuse, with one line."""
    error = runtime_refusal(handle)
    if error:
        raise InvalidModelError(
            f"{handle.path}: onnx.checker rejects the model ({error}) and ONNX Runtime does not load "
            f"it; {step} needs a valid model",
            hint=f"ortprep check {handle.path} --ep cpu shows it; re-export the model or fix what the checker names",
        )


def converter_defects(handle: ModelHandle) -> list:
    """Defects that converters are known to write and that onnx's checker lets through."""
    from collections import Counter

    from ortprep.findings import Finding

    counts = Counter(entry.domain or "ai.onnx" for entry in handle.proto.opset_import)
    findings = []
    for domain, count in sorted(counts.items()):
        if count > 1:
            versions = sorted({e.version for e in handle.proto.opset_import if (e.domain or "ai.onnx") == domain})
            findings.append(
                Finding.of(
                    "MOD011",
                    f"the model imports domain '{domain}' {count} times (versions {', '.join(map(str, versions))}); "
                    "ONNX Runtime's quantizer and some EPs refuse it ('Failed to find proper ai.onnx domain')",
                    fix="ortprep convert MODEL --repair -o MODEL.fixed.onnx (removes identical duplicates, verified)"
                    if len(versions) == 1
                    else f"re-export with one opset for '{domain}', or ortprep convert MODEL --opset N",
                    source="ONNX IR: each domain is imported once",
                )
            )
    return findings


def drop_duplicate_imports(proto) -> list[str]:
    """Remove opset imports that repeat a domain with the same version (safe); returns what was done."""
    seen: set[tuple[str, int]] = set()
    keep, dropped = [], []
    for entry in proto.opset_import:
        key = (entry.domain, entry.version)
        if key in seen:
            dropped.append(f"{entry.domain or 'ai.onnx'} {entry.version}")
            continue
        seen.add(key)
        keep.append(entry)
    if dropped:
        del proto.opset_import[:]
        proto.opset_import.extend(keep)
    return dropped
