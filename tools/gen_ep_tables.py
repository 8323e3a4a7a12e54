"""Generate ortprep/eps/data/*.json from a folder of raw per-EP facts (kept outside this repository).

    .venv/bin/python tools/gen_ep_tables.py --src FACTS_DIR [--out ortprep/eps/data]

One JSON file per table. Every entry carries ``src``, a key into the file's ``sources`` map,
which names where the fact came from and at which version. The raw files are not committed;
only this script's output is.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SOURCES = {
    "ort-main": {
        "what": "microsoft/onnxruntime docs/OperatorKernels.md (registered kernels of a CPU+CUDA+DML build)",
        "version": "onnxruntime main 735e69a (1.25.0 dev, 2026-02-13)",
    },
    "ort-newer": {
        "what": "microsoft/onnxruntime docs/OperatorKernels.md, later revision (differences only)",
        "version": "onnxruntime 001d12d",
    },
    "ort-wheel": {
        "what": "onnxruntime wheel get_all_opkernel_def() and tools/mobile_helpers tables",
        "version": "onnxruntime 1.31.1 (PyPI)",
    },
    "dml-registration": {
        "what": "microsoft/onnxruntime DmlExecutionProvider OperatorRegistration.cpp and Query* functions",
        "version": "onnxruntime main 735e69a",
    },
    "onnx-tensorrt": {
        "what": "onnx/onnx-tensorrt docs/operators.md",
        "version": "onnx-tensorrt 10.1-GA 96e7811 (TensorRT 10.0, opset 9-20)",
    },
    "openvino-data-ops": {
        "what": "microsoft/onnxruntime openvino/ov_versions/data_ops.cc and capability.cc",
        "version": "onnxruntime main 735e69a (OpenVINO 2025.1-2025.4 tables)",
    },
    "qnn": {
        "what": "QNN EP 2.5.0 doc 'Supported ONNX operators' and onnxruntime-qnn op builder factory",
        "version": "QNN EP 2.5.0 doc; onnxruntime/onnxruntime-qnn cee6c0d",
    },
    "xnnpack": {
        "what": "microsoft/onnxruntime xnnpack_execution_provider.cc kernel registrations",
        "version": "onnxruntime main 735e69a",
    },
    "constraints": {
        "what": "ep_constraints.csv: documented and source-code constraints beyond op tables (see each row's source)",
        "version": "read 2026-11-22",
    },
}

OPENVINO_BUILD = "2025.4"  # capability.cc treats unknown versions as 2025.4


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses: map(int64,tensor(float)) stays whole."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if current:
        parts.append("".join(current).strip())
    return [p for p in parts if p]


def normalize_type(onnx_type: str) -> str:
    """tensor(float) -> float; other type strings stay as written (seq(tensor(float)), map(...))."""
    if onnx_type.startswith("tensor(") and onnx_type.endswith(")"):
        return onnx_type[len("tensor(") : -1]
    return onnx_type


def parse_constraints(text: str) -> dict[str, list[str]] | None:
    if not text:
        return None
    result = {}
    for part in text.split(";"):
        name, _, types = part.partition("=")
        result[name.strip()] = sorted({normalize_type(t) for t in split_top_level(types)})
    return result


RESTRICTION_WORDS = re.compile(
    r"\b(only|must|should|not supported|unsupported|requires?|exclusively|needs?)\b", re.IGNORECASE
)


def condition_and_note(text: str) -> dict[str, str | None]:
    """Split a table note into a condition (it restricts when the EP takes the node) or a plain note
    ("fp16 supported since 1.18.0" restricts nothing)."""
    text = (text or "").strip()
    if not text:
        return {"condition": None}
    if RESTRICTION_WORDS.search(text):
        return {"condition": text}
    return {"condition": None, "note": text}


def as_int(text: str) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def op_entry(domain: str, op: str, note: str, src: str, **more) -> dict:
    """An entry of an op-level table (no opset or type data unless ``more`` gives it)."""
    return {
        "domain": domain,
        "op": op,
        "since": None,
        "until": None,
        "types": None,
        **condition_and_note(note),
        "src": src,
        **more,
    }


def kernel_entry(row: dict[str, str], src: str) -> dict:
    return {
        "domain": row["domain"],
        "op": row["op"],
        "since": int(row["since_version"]),
        "until": as_int(row["until_version"]),
        "types": parse_constraints(row["type_constraints"]),
        "src": src,
    }


def constraints_for(rows: list[dict[str, str]], ep: str) -> list[dict]:
    selected = []
    for row in rows:
        eps = [e.strip() for e in row["ep"].split(",")]
        if ep in eps:
            selected.append({key: row[key] for key in row} | {"src": "constraints"})
    return selected


def table(ep: str, granularity: str, entries: list[dict], constraints: list[dict], **extra) -> dict:
    used = sorted({e["src"] for e in entries} | ({"constraints"} if constraints else set()))
    entries.sort(key=lambda e: (e["domain"], e["op"], e.get("since") or 0))
    return {
        "ep": ep,
        "granularity": granularity,
        "sources": {key: SOURCES[key] for key in used},
        "entries": entries,
        "constraints": constraints,
        **extra,
    }


def build_cpu(src: Path, constraints: list[dict]) -> dict:
    entries = [kernel_entry(r, "ort-wheel") for r in read_csv(src / "ort_kernels_cpu_ort-1.31.1.csv")]
    return table("cpu", "kernel", entries, constraints_for(constraints, "cpu"))


def build_cuda(src: Path, constraints: list[dict]) -> dict:
    rows = [r for r in read_csv(src / "ort_kernels.csv") if r["ep"] == "cuda"]
    keyed = {(r["domain"], r["op"], r["since_version"]): kernel_entry(r, "ort-main") for r in rows}
    for change in read_csv(src / "ort_kernels_delta_001d12d.csv"):
        if change["ep"] != "cuda":
            continue
        key = (change["domain"], change["op"], change["since_version"])
        if change["change"] == "removed":
            keyed.pop(key, None)
        else:
            keyed[key] = kernel_entry(change, "ort-newer")
    # Kernels in the internal NHWC domain only serve ORT's own layout transform.
    entries = [e for e in keyed.values() if e["domain"] != "com.ms.internal.nhwc"]
    return table("cuda", "kernel", entries, constraints_for(constraints, "cuda"))


def build_dml(src: Path, constraints: list[dict], ep: str = "dml") -> dict:
    registration = {
        (r["domain"], r["op"], r["since_version"]): r for r in read_csv(src / "dml_registration.csv")
    }
    entries = []
    for row in read_csv(src / "ort_kernels.csv"):
        if row["ep"] != "dml":
            continue
        entry = kernel_entry(row, "ort-main")
        reg = registration.get((row["domain"], row["op"], row["since_version"]))
        if reg:
            entry["dml"] = {
                "graph": reg["dml_graph_support"],
                "cpu_inputs": [int(i) for i in reg["required_constant_cpu_inputs"].split(",") if i.strip()],
                "input_count": as_int(reg["input_count_required_for_graph_support"]),
                "query": reg["support_query_function"] or None,
                "compile_condition": reg["compile_condition"] or None,
            }
            entry["src"] = "ort-main"
        entries.append(entry)
    queries = {
        r["support_query_function"]: {"applies_to": r["applies_to"], "rejected_when": r["node_rejected_by_dml_when"]}
        for r in read_csv(src / "dml_support_queries.csv")
    }
    extra = {"support_queries": queries, "support_queries_src": "dml-registration", "max_opset": 20}
    result = table(ep, "kernel", entries, constraints_for(constraints, ep), **extra)
    result["sources"]["dml-registration"] = SOURCES["dml-registration"]
    return result


def build_tensorrt(src: Path, constraints: list[dict]) -> dict:
    entries = []
    for row in read_csv(src / "tensorrt_ops.csv"):
        if row["supported"] != "Y":
            continue
        types = sorted({normalize_type(t) for t in split_top_level(row["onnx_types"])})
        entry = op_entry("ai.onnx", row["op"], row["restrictions"], "onnx-tensorrt")
        entry["types"] = {"*": types} if types else None
        entries.append(entry)
    return table("tensorrt", "op", entries, constraints_for(constraints, "tensorrt"), opset_range=[9, 20])


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def build_openvino(src: Path, constraints: list[dict], device: str) -> dict:
    rules = json.loads((src / "openvino_rules.json").read_text())
    table_device = "CPU" if device == "NPU" else device  # capability.cc maps NPU to the CPU lists
    build = _version_tuple(OPENVINO_BUILD)
    ops: dict[str, dict] = {}
    for row in read_csv(src / "openvino_ops.csv"):
        if row["device"] != table_device or _version_tuple(row["min_openvino_version"]) > build:
            continue
        domain = "com.microsoft" if row["domain_hint"] == "com.microsoft" else "ai.onnx"
        # only_in_model: rejected when the whole graph has 3 nodes or fewer and starts with this op
        ops[row["op_type"]] = op_entry(
            domain, row["op_type"], "", "openvino-data-ops", only_in_model=row["supported_only_in_model"] == "yes"
        )
    io_lists = rules["io_type_lists"]
    device_key = "gpu" if table_device == "GPU" else "cpu_and_npu"
    io_types = sorted(
        {
            item["onnx_type"].lower()
            for item in io_lists.get(device_key, [])
            if _version_tuple(item["min_openvino_version"]) <= build
        }
    )
    modes = [m for m in rules.get("unsupported_op_modes", [])]
    ep = f"openvino-{device.lower()}"
    return table(
        ep,
        "op",
        list(ops.values()),
        constraints_for(constraints, ep),
        io_types=sorted(set(io_types) | {"int16", "uint16"}),  # accepted before any list is consulted
        unsupported_op_modes=modes,
        openvino_version=OPENVINO_BUILD,
    )


def build_qnn(src: Path, constraints: list[dict]) -> dict:
    entries = []
    for row in read_csv(src / "qnn_ops.csv"):
        documented = row["in_qnn_ep_2.5.0_doc"] == "yes"
        builder = row["op_builder_in_onnxruntime_qnn_cee6c0d"] == "yes"
        if not (documented or builder):
            continue
        entries.append(op_entry(row["domain"], row["op"], row["notes"], "qnn"))
    return table("qnn", "op", entries, constraints_for(constraints, "qnn"))


def build_mobile(src: Path, constraints: list[dict], ep: str) -> dict:
    entries = []
    if ep == "coreml":
        rows = [r for r in read_csv(src / "coreml_ops.csv") if r["model_format"] == "MLProgram"]
    else:
        rows = read_csv(src / "nnapi_ops.csv")
    for row in rows:
        entries.append(op_entry(row["domain"], row["op"], row["note"], "ort-wheel"))
    extra = {"model_format": "MLProgram"} if ep == "coreml" else {}
    return table(ep, "op", entries, constraints_for(constraints, ep), **extra)


def build_xnnpack(src: Path, constraints: list[dict]) -> dict:
    entries = []
    for row in read_csv(src / "xnnpack_ops.csv"):
        entries.append(
            {
                "domain": row["model_domain"],
                "op": row["op"],
                "since": int(row["since_version"]),
                "until": as_int(row["until_version"]),
                "types": parse_constraints(row["type_constraints"]),
                **condition_and_note(row["doc_note"]),
                "src": "xnnpack",
            }
        )
    return table("xnnpack", "kernel", entries, constraints_for(constraints, "xnnpack"))


def generate(src: Path, out: Path) -> list[Path]:
    constraints = read_csv(src / "ep_constraints.csv")
    tables = {
        "cpu": build_cpu(src, constraints),
        "cuda": build_cuda(src, constraints),
        "dml": build_dml(src, constraints),
        # The NPU uses the DML kernels; only its constraints differ.
        "dml-npu": {"ep": "dml-npu", "entries_from": "dml", "entries": [], **{
            k: v for k, v in build_dml(src, constraints, ep="dml-npu").items() if k not in ("ep", "entries")
        }},
        "tensorrt": build_tensorrt(src, constraints),
        "openvino-cpu": build_openvino(src, constraints, "CPU"),
        "openvino-gpu": build_openvino(src, constraints, "GPU"),
        "openvino-npu": build_openvino(src, constraints, "NPU"),
        "qnn": build_qnn(src, constraints),
        "coreml": build_mobile(src, constraints, "coreml"),
        "nnapi": build_mobile(src, constraints, "nnapi"),
        "xnnpack": build_xnnpack(src, constraints),
    }
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in tables.items():
        path = out / f"{name}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True,
                        help="folder of raw per-EP facts (CSV/JSON/Markdown with SOURCES.md)")
    parser.add_argument("--out", type=Path, default=ROOT / "ortprep" / "eps" / "data")
    args = parser.parse_args()
    for path in generate(args.src, args.out):
        data = json.loads(path.read_text())
        entries = (
            f"entries of {data['entries_from']}" if data.get("entries_from") else f"{len(data['entries'])} entries"
        )
        print(f"{path.relative_to(ROOT)}: {entries}, {len(data['constraints'])} constraints")


if __name__ == "__main__":
    main()
