"""Which ONNX Runtime will load this model: its IR version and default-domain opset against the
installed ORT (probed) and against a named release (``--ort-version``, from the release table in
``ortprep.eps.ort_releases``)."""

from __future__ import annotations

from ortprep.eps.ort_releases import release_limits
from ortprep.findings import Finding
from ortprep.runtime.providers import import_ort, ort_max_ir, ort_max_opset


def runtime_findings(ir_version: int, opset: int | None, ort_version: str | None = None) -> list[Finding]:
    """Errors for a model the installed ORT, or the named release, refuses to load."""
    findings: list[Finding] = []
    ort = import_ort()
    targets = []
    if ort is not None:
        targets.append((f"the installed ONNX Runtime {getattr(ort, '__version__', '?')}", ort_max_ir(), ort_max_opset(),
                        "probe of the installed onnxruntime", True))
    if ort_version is not None:
        limits = release_limits(ort_version)
        targets.append(
            (f"ONNX Runtime {ort_version}", limits["max_ir_version"], limits["max_opset"], limits["source"], False)
        )
    for who, max_ir, max_opset, source, installed in targets:
        if max_ir is not None and ir_version > max_ir:
            findings.append(
                Finding.of(
                    "MOD009",
                    f"model IR version {ir_version} is newer than {who} loads (IR <= {max_ir}); it refuses the model",
                    fix=f"ortprep convert MODEL --ir-version {max_ir} -o MODEL.ir{max_ir}.onnx "
                    "(stamps the older IR version "
                    "and verifies the result), or export with an older onnx",
                    source=source,
                )
            )
        if opset is not None and max_opset is not None and opset > max_opset:
            code = "MOD002" if installed else "MOD010"
            findings.append(
                Finding.of(
                    code,
                    f"model uses opset {opset}; {who} supports up to {max_opset}",
                    fix=f"convert down: ortprep convert MODEL --opset {max_opset}"
                    + (", or upgrade ONNX Runtime" if installed else ""),
                    source=source,
                )
            )
    return findings
