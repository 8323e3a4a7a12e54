"""Support tables backed by the installed ONNX Runtime: the CPU EP's kernel registry, read in a
child process, is exact for the build at hand, so it is preferred over the generated CPU table."""

from __future__ import annotations

import functools
import logging

from ortprep.eps.tables import OPEN_ENDED, SupportTable, TableEntry, _index, load_table, normalize_domain
from ortprep.runtime.providers import import_ort, probe_runtime

log = logging.getLogger(__name__)


def support_table(ep: str, *, prefer_runtime: bool = True) -> SupportTable:
    """The support table of an EP (by canonical name): for the CPU the installed ORT's kernel
    registry when there is one, else the generated table (measured over documented)."""
    if ep == "cpu" and prefer_runtime:
        installed = installed_cpu_table()
        if installed is not None:
            return installed
    return load_table(ep)


@functools.lru_cache(maxsize=1)
def installed_cpu_table() -> SupportTable | None:
    """The CPU EP's table from the installed ORT's kernel registry (exact for that build), or
    None without ORT or when the registry cannot be read."""
    if import_ort() is None:
        return None
    # In a child: some builds (onnxruntime-openvino 1.24.1) crash inside get_all_opkernel_def.
    probe = probe_runtime(kernels=True)
    if not probe.ok or probe.kernels is None:
        log.debug("kernel registry unavailable (%s); using the generated CPU table", probe.error)
        return None
    merged: dict[tuple[str, str, int, int], dict[str, set[str]]] = {}
    for domain, op_name, (start, end), type_constraints in probe.kernels:
        key = (normalize_domain(domain), op_name, start, end)
        constraints = merged.setdefault(key, {})
        for name, types in type_constraints.items():
            constraints.setdefault(name, set()).update(
                t.removeprefix("tensor(").removesuffix(")") if t.startswith("tensor(") else t for t in types
            )
    entries = [
        TableEntry(
            domain=domain,
            op=op,
            since=start,
            until=None if end >= OPEN_ENDED else end,
            types={name: tuple(sorted(types)) for name, types in constraints.items()} or None,
            src="ort-installed",
        )
        for (domain, op, start, end), constraints in merged.items()
    ]
    version = probe.version or "?"
    return SupportTable(
        ep="cpu",
        granularity="kernel",
        sources={
            "ort-installed": {"what": "installed onnxruntime kernel registry", "version": f"onnxruntime {version}"}
        },
        entries=_index(entries),
    )
