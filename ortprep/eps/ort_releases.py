"""ONNX Runtime releases as data: the newest IR version and default-domain opset each release
loads (``data/ort_versions.json``, measured by tools/probe_ort_versions.py). The findings for a
model against the installed ORT and a named release are made in ``ortprep.runtime.compat``."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ortprep.errors import UsageError


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
