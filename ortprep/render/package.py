"""Human output of ``package`` and ``load --package``: pure functions of their records."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


def _figure(value: Any, digits: int = 4) -> str:
    return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))


def _findings(record: dict[str, Any], console: Console) -> None:
    for finding in record.get("findings", []):
        style = STYLE.get(finding["severity"], "")
        console.print(f"[{style}]{finding['code']}[/] {finding['message']}", highlight=False)
        if finding.get("fix"):
            console.print(f"    fix: {finding['fix']}", highlight=False)


def render_package(record: dict[str, Any], console: Console) -> None:
    verdict = f"written: {record['package']}" if record["written"] else "not written"
    console.print(f"[bold]package[/] {record['model']}: {verdict}", highlight=False)
    table = Table(show_lines=False)
    for column in ("variant", "EP", "kind", "status", "placement", "accuracy", "load here"):
        table.add_column(column, overflow="fold")
    for row in record["variants"]:
        proofs = row.get("proofs") or {}
        placement = proofs.get("placement") or {}
        accuracy = proofs.get("accuracy") or {}
        load = proofs.get("load") or {}
        share = placement.get("node_share")
        load_text = load.get("status", "-")
        if load.get("vs_float"):
            load_text += f", cosine {_figure(load['vs_float'].get('cosine'), 5)} vs float"
        table.add_row(
            escape(row["name"]),
            row["ep"],
            row["kind"],
            row["status"],
            f"{placement.get('verdict', '-')} ({share:.0%})" if share is not None else placement.get("verdict", "-"),
            f"cosine {_figure(accuracy.get('cosine'), 5)}" if accuracy else "-",
            load_text,
        )
    console.print(table)
    ort = record.get("ort_model_package") or {}
    if ort.get("read_by"):
        console.print(f"read back by {ort['read_by']} (schema {ort.get('schema_version')})", highlight=False)
    elif ort:
        console.print(f"not read back: {ort.get('why')}", highlight=False)
    _findings(record, console)


def render_package_load(record: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]load --package[/] {record['package']}", highlight=False)
    table = Table()
    for column in ("EP", "variant", "picked by", "status", "nodes on EP", "vs float", "median ms"):
        table.add_column(column, overflow="fold")
    for row in record["results"]:
        load = row.get("load") or {}
        total = (load.get("three_way") or {}).get("total") or {}
        nodes = f"{load.get('nodes_on_ep')}/{load.get('nodes_total')}" if load.get("nodes_total") else "-"
        table.add_row(row["ep"], row.get("variant") or "none", row.get("selected_by") or "-", row.get("status", "-"),
                      nodes, f"cosine {_figure(total.get('cosine'), 5)}" if total else "-",
                      _figure((load.get("latency_ms") or {}).get("median"), 3))
    console.print(table)
    for row in record["results"]:
        if row.get("why"):
            console.print(f"{row['ep']}: {row['why']}", highlight=False)
        for finding in row.get("findings", []):
            if finding["severity"] in ("error", "warning"):
                console.print(
                    f"[{STYLE[finding['severity']]}]{finding['code']}[/] {finding['message']}", highlight=False
                )
    _findings(record, console)
