"""Human rendering with Rich: pure functions of a report record."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def human_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def format_shape(shape: list | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def render_findings(findings: list[dict[str, Any]], console: Console) -> None:
    """Findings, errors first, each with its fix on the line below."""
    if not findings:
        console.print("No findings.")
        return
    order = {"error": 0, "warning": 1, "info": 2}
    console.print("[bold]Findings[/]")
    for finding in sorted(findings, key=lambda f: (order.get(f["severity"], 3), f["code"])):
        style = SEVERITY_STYLE.get(finding["severity"], "")
        console.print(f"  [{style}]{finding['severity']:<7}[/] {finding['code']}  {finding['message']}", highlight=False)
        if finding.get("fix"):
            console.print(f"           fix: {finding['fix']}", highlight=False)
    counts = Counter(f["severity"] for f in findings)
    console.print(", ".join(f"{counts[s]} {s}" for s in ("error", "warning", "info") if counts[s]))


def render_inspect(record: dict[str, Any], console: Console) -> None:
    model = record["model"]
    console.print(f"[bold]{model['path']}[/]  {human_bytes(model['size'])}")
    producer = record["producer"]
    opsets = ", ".join(f"{domain} {version}" for domain, version in record["opsets"].items())
    console.print(f"IR version {record['ir_version']}; opsets: {opsets or 'none'}")
    if producer["name"] or producer["version"]:
        console.print(f"producer: {producer['name']} {producer['version']}".rstrip())
    for name, digest in model["sha256"].items():
        console.print(f"sha256 {name}: {digest}")

    io_table = Table(title="Inputs and outputs")
    for column in ("", "name", "type", "dtype", "shape"):
        io_table.add_column(column)
    for direction in ("inputs", "outputs"):
        for value in record[direction]:
            io_table.add_row(
                direction[:-1], value["name"], value["kind"], value["dtype"] or "-", format_shape(value["shape"])
            )
    console.print(io_table)

    nodes = record["nodes"]
    console.print(
        f"nodes: {nodes['total']} ({nodes['top_level']} top level, {nodes['in_subgraphs']} in "
        f"{nodes['subgraphs']} subgraphs); parameters: {record['parameters']:,}"
    )
    ops_table = Table(title="Operators")
    ops_table.add_column("domain")
    ops_table.add_column("op")
    ops_table.add_column("count", justify="right")
    for domain, ops in record["op_histogram"].items():
        for op, count in ops.items():
            ops_table.add_row(domain, op, str(count))
    console.print(ops_table)
    if record["custom_domains"]:
        console.print("custom domains: " + ", ".join(record["custom_domains"]))

    if record["initializers"]:
        weights = Table(title="Initializers")
        weights.add_column("dtype")
        weights.add_column("count", justify="right")
        weights.add_column("size", justify="right")
        for dtype, stats in record["initializers"].items():
            weights.add_row(dtype, str(stats["count"]), human_bytes(stats["bytes"]))
        console.print(weights)
    constants = record["constant_nodes"]
    if constants["count"]:
        console.print(f"tensors in Constant nodes and attributes: {constants['count']} ({human_bytes(constants['bytes'])})")
    if record["external_data"]:
        external = Table(title="External data")
        external.add_column("file")
        external.add_column("size", justify="right")
        external.add_column("tensors", justify="right")
        for entry in record["external_data"]:
            external.add_row(entry["location"], human_bytes(entry["size"]), str(entry["tensors"]))
        console.print(external)
    for key, value in record["metadata"].items():
        console.print(f"metadata {key}: {value}")
    checker = record["checker"]
    console.print("onnx.checker: " + ("passed" if checker["passed"] else f"[red]failed[/] ({checker['error']})"))
    runtime = record["runtime"]
    ort = runtime["onnxruntime"] or "not installed"
    console.print(
        f"onnx {runtime['onnx']} (opset <= {runtime['onnx_max_opset']}); onnxruntime {ort}"
        + (f" (opset <= {runtime['ort_max_opset']})" if runtime["ort_max_opset"] else "")
    )
    render_findings(record["findings"], console)
