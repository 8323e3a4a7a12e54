"""Which ONNX Runtime will load this model: the model's IR version and default-domain opset
against the installed ORT (probed) and against a named release (``--ort-version``, from
``data/ort_versions.json``, measured by tools/probe_ort_versions.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ortprep.errors import UsageError
from ortprep.findings import Finding


@lru_cache(maxsize=1)
def release_table() -> dict[str, dict[str, Any]]:
    text = resources.files("ortprep.eps").joinpath("data/ort_versions.json").read_text(encoding="utf-8")
    return json.loads(text)["releases"]


def release_limits(version: str) -> dict[str, Any]:
    """{"max_ir_version", "max_opset", "source"} of an ORT release ("1.24" or "1.24.1")."""
    minor = ".".join(version.strip().split(".")[:2])
    table = release_table()
    if minor not in table:
        raise UsageError(f"no data for ONNX Runtime {version}",
                         hint="known releases: " + ", ".join(table) + " (tools/probe_ort_versions.py measures more)")
    return table[minor]


def runtime_findings(ir_version: int, opset: int | None, ort_version: str | None = None) -> list[Finding]:
    """Errors for a model the installed ORT, or the named release, refuses to load."""
    from ortprep.runtime.providers import import_ort, ort_max_ir, ort_max_opset

    findings: list[Finding] = []
    ort = import_ort()
    targets = []
    if ort is not None:
        targets.append((f"the installed ONNX Runtime {getattr(ort, '__version__', '?')}", ort_max_ir(), ort_max_opset(),
                        "probe of the installed onnxruntime", True))
    if ort_version is not None:
        limits = release_limits(ort_version)
        targets.append((f"ONNX Runtime {ort_version}", limits["max_ir_version"], limits["max_opset"], limits["source"], False))
    for who, max_ir, max_opset, source, installed in targets:
        if max_ir is not None and ir_version > max_ir:
            findings.append(Finding.of(
                "MOD009", f"model IR version {ir_version} is newer than {who} loads (IR <= {max_ir}); it refuses the model",
                fix=f"ortprep convert MODEL --ir-version {max_ir} -o MODEL.ir{max_ir}.onnx (stamps the older IR version "
                "and verifies the result), or export with an older onnx", source=source))
        if opset is not None and max_opset is not None and opset > max_opset:
            code = "MOD002" if installed else "MOD010"
            findings.append(Finding.of(
                code, f"model uses opset {opset}; {who} supports up to {max_opset}",
                fix=f"convert down: ortprep convert MODEL --opset {max_opset}" + (", or upgrade ONNX Runtime" if installed else ""),
                source=source))
    return findings
