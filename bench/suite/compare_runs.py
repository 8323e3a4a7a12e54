"""Two runs of the journey and the apps benchmark, verdict by verdict: did a change of code change one?

    .venv/bin/python -m bench.suite.compare_runs BEFORE AFTER [-o COMPARE.md]

BEFORE and AFTER are folders holding the runs' output folders: every ``journey*/results.json``
(``python -m bench.suite.journey --out ...``) and ``apps*/results.json`` (``python -m
bench.suite.apps.run --out ...``) under them is read; rows are matched by model (journey) and by
(app, model, transform) (apps).

Compared, per journey row: each step's exit and error codes (a check's proven verdict), the outcome
(complete, where it stopped, via FP16), the precision quantize chose, each check's predicted and
proven verdict against the real session's, each decision agreement (n/N) and the passes of a wrong
output; per apps row: ortprep's exit, the file written, its error codes and the verdict. Figures
(cosines, seconds) are shown, not compared.

A difference is named as noise where the runs say so: the deployed files are byte-identical and
only what QNN's HTP simulator computed moved ("QNN simulator"), or quantize's search stopped on its
clock in either run (`--search-seconds` or the EP's time bound: "clock-bounded search").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

QNN_SIDE = ("qnn_qdq", "qnn_ctx", "qnn_vs_cpu_qdq", "verdict qnn")
CLOCK = re.compile(r"the search stopped: (the time bound|the EP's time|[^;]*--search-seconds)")


def load_rows(folder: Path) -> tuple[dict, dict]:
    journey, apps = {}, {}
    for path in sorted(folder.glob("journey*/results.json")):
        for row in json.loads(path.read_text()).get("rows", []):
            journey[row["model"]] = (row, path.parent)
    for path in sorted(folder.glob("apps*/results.json")):
        for result in json.loads(path.read_text()):
            for row in result.get("rows", []):
                # where bench.suite.apps.run wrote the file the app ran on
                runs = path.parent / result["app"] / "runs" / row["model"]
                written = runs / row["transform"].replace(" ", "").replace("--", "_") / (row.get("app_file") or "-")
                apps[(result["app"], row["model"], row["transform"])] = {**row, "_file": digest(written)}
    return journey, apps


def _codes(entry: dict) -> list[str]:
    findings = (entry.get("report") or {}).get("findings", [])
    return sorted({f["code"] for f in findings if f.get("severity") == "error"})


def journey_fields(row: dict) -> dict[str, str]:
    """The verdicts of one journey row, as comparable strings."""
    fields = {"outcome": f"complete={row['outcome']['complete']} stopped_at={row['outcome'].get('stopped_at')} "
                         f"via={row['outcome'].get('via')}",
              "deployed": str(row.get("deployed"))}
    for name, entry in row["steps"].items():
        text = f"exit {entry['exit']}"
        if name.startswith("check"):
            result = ((entry.get("report") or {}).get("results") or [{}])[0]
            text += f" (proven {result.get('verdict')})"
        if _codes(entry):
            text += " " + ",".join(_codes(entry))
        fields[f"step {name}"] = text
    auto = ((row["steps"].get("quantize") or {}).get("report") or {}).get("auto") or {}
    fields["precision chosen"] = str(auto.get("chosen"))
    for label, record in row["verdicts"].items():
        fields[f"verdict {label}"] = (f"{record.get('predicted')} / {record.get('proven')} "
                                      f"/ session {record.get('session')}")
    for label, measure in row["measures"].items():
        decision = measure.get("decision")
        if decision:
            fields[f"decision {label}"] = f"{decision['agree']}/{decision['samples']}"
    fields["wrong passes"] = str(len(row["wrong_passes"]))
    check = row.get("wrong_pass_check") or {}
    if check.get("checked"):
        fields["wrong pass check"] = f"{check['agree']}/{check['samples']} confirmed={check['confirmed']}"
    return fields


def journey_figures(row: dict) -> str:
    shown = []
    for label in ("qnn_qdq", "cpu_qdq", "qnn_ctx"):
        measure = (row["measures"].get(label) or {}).get("measure") or {}
        if measure.get("cosine") is not None:
            shown.append(f"{label} cosine {measure['cosine']:.4f}")
    return (", ".join(shown) or "no deployed model's figures") + f"; {row['seconds']:.0f} s"


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.exists() else None


def search_stops(row: dict) -> list[str]:
    report = (row["steps"].get("quantize") or {}).get("report") or {}
    texts = [f.get("message", "") for f in report.get("findings", [])]
    return [m.group(0) for text in texts for m in CLOCK.finditer(text)]


def why(field: str, before: tuple, after: tuple) -> str:
    """Noise where the runs show it, else "CHANGED"."""
    (row_b, folder_b), (row_a, folder_a) = before, after
    model = row_b["model"]
    files = [(digest(folder_b / model / name), digest(folder_a / model / name)) for name in ("qdq.onnx", "fp16.onnx")]
    same_files = any(b and b == a for b, a in files)
    if same_files and any(side in field for side in QNN_SIDE):
        return "noise: QNN simulator (the deployed file is byte-identical in both runs; only QNN's figures moved)"
    stops = search_stops(row_b) + search_stops(row_a)
    if stops and not same_files:
        return f"noise: clock-bounded search ({'; '.join(sorted(set(stops)))})"
    return "CHANGED"


def compare(before_dir: Path, after_dir: Path) -> tuple[str, int]:
    journey_b, apps_b = load_rows(before_dir)
    journey_a, apps_a = load_rows(after_dir)
    lines = [f"Before: `{before_dir}`; after: `{after_dir}`.", "", "## Journey (bench.suite.journey)", ""]
    changed = 0
    for model in sorted(set(journey_b) | set(journey_a)):
        if model not in journey_b or model not in journey_a:
            lines.append(f"- {model}: only in the {'after' if model in journey_a else 'before'} run")
            changed += 1
            continue
        fields_b, fields_a = journey_fields(journey_b[model][0]), journey_fields(journey_a[model][0])
        differing = [k for k in sorted(set(fields_b) | set(fields_a)) if fields_b.get(k) != fields_a.get(k)]
        verdict = "same verdicts" if not differing else f"{len(differing)} field(s) differ"
        files = [(digest(journey_b[model][1] / model / name), digest(journey_a[model][1] / model / name))
                 for name in ("qdq.onnx", "fp16.onnx")]
        files = [f"{b} / {a}" + (" (byte-identical)" if a == b else "") for b, a in files if b or a]
        lines += [f"### {model} ({journey_b[model][0]['half']}): {verdict}", "",
                  f"Figures before: {journey_figures(journey_b[model][0])}; "
                  f"after: {journey_figures(journey_a[model][0])}. "
                  f"Deployed file, sha256 before / after: {', '.join(files) or 'none written'}.",
                  "", "| field | before | after | |", "|---|---|---|---|"]
        for key in sorted(set(fields_b) | set(fields_a)):
            b, a = fields_b.get(key, "-"), fields_a.get(key, "-")
            note = "" if b == a else why(key, journey_b[model], journey_a[model])
            changed += note == "CHANGED"
            lines.append(f"| {key} | {b} | {a} | {note or 'same'} |")
        lines.append("")
    lines += ["## Applications (bench.suite.apps.run)", "",
              "| app | model | transform | before: exit, written, errors, verdict | after | |",
              "|---|---|---|---|---|---|"]
    for key in sorted(set(apps_b) | set(apps_a)):
        def cell(row: dict | None) -> str:
            if row is None:
                return "-"
            value = (row.get("app") or {}).get("value")
            shown = "-" if value is None else f"{value:.2f}"
            return (f"{row['exit']}, {'yes' if row['written'] else 'no'}, {','.join(row.get('errors') or []) or '-'}, "
                    f"{row['verdict']} (app {shown})")
        b, a = apps_b.get(key), apps_a.get(key)
        keys = ("exit", "written", "errors", "verdict")
        same = b is not None and a is not None and all(b.get(k) == a.get(k) for k in keys)
        changed += not same
        note = "same" if same else "CHANGED"
        if same and (b.get("app") or {}).get("value") != (a.get("app") or {}).get("value"):
            note = "same verdict; the app's figure moved" + (
                " on a byte-identical file (the app's own run-to-run noise)" if b["_file"] and b["_file"] == a["_file"]
                else f" (files {b['_file']} / {a['_file']})")
        lines.append(f"| {' | '.join(key)} | {cell(b)} | {cell(a)} | {note} |")
    lines += ["", f"Differences not named as noise: {changed}."]
    return "\n".join(lines) + "\n", changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("-o", "--output", type=Path, help="write the comparison here (Markdown) as well")
    args = parser.parse_args()
    text, changed = compare(args.before, args.after)
    if args.output:
        args.output.write_text(text)
    print(text)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
