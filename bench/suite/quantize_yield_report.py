"""The report of the int8 yield run (bench/suite/quantize_yield.py): its per-model tables and the
summary per half, from the rows in OUT/results.json.
"""

from __future__ import annotations

import re

from bench.referee import refusal_class
from bench.suite.journey_corpus import CORPUS

CASES = {case.name: case for case in CORPUS}

CALIB, CALIB_SEED, FRESH_SEED = 24, 1, 23
TIMEOUT = 900.0
# what a refusal's findings may point to, and the words that name it
REMEDIES = {"--auto": r"--auto(?!-)", "--auto-exclude": r"--auto-exclude", "--exclude-node": r"--exclude-node",
            "A16W8": r"A16W8|uint16 activations", "A16W16": r"A16W16", "dynamic int8": r"dynamic",
            # --auto's label for static int8 is "static uint8 activations, int8 weights" (auto._label)
            "static int8": r"--static|static int8|static u?int8 activations", "FP16": r"convert \S+ --fp16"}


def remedies_named(findings: list[dict]) -> list[str]:
    """The remedies (REMEDIES) a command's error findings name, in their message or fix."""
    text = " ".join(f"{f.get('message') or ''} {f.get('fix') or ''}" for f in findings if f.get("severity") == "error")
    return [name for name, pattern in REMEDIES.items() if re.search(pattern, text, re.IGNORECASE)]


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def measured_cell(row: dict, record: dict | None) -> str:
    judged = (record or {}).get("judged")
    if not judged:
        return "-"
    if not judged.get("runs"):
        return ("does not load: " if not judged.get("loads") else "does not run: ") + judged["error"][:80].replace(
            "|", "/"
        )
    low, high = judged["interval"]
    what = "" if row["decision"] else " at 0.99"
    return f"{judged['agree']}/{judged['samples']}{what} ({_pct(low)}-{_pct(high)})"


def refused_cell(row: dict, record: dict) -> str:
    """The refused file's measurement: what measured_cell says of a written one."""
    return measured_cell(row, {"judged": record.get("refused_judged")}) + (
        "" if row["decision"] else f", lowest cosine {_num((record.get('refused_judged') or {}).get('lowest_cosine'))}")


def cosine_cell(record: dict | None) -> str:
    judged = (record or {}).get("judged")
    if not judged or not judged.get("runs"):
        return "-"
    return f"{_num(judged['lowest_cosine'])} / {_num(judged['norm_ratio'])}" + (
        " NaN/Inf" if judged["nonfinite"] else ""
    )


def judged_verdict(record: dict) -> str:
    if record.get("below_bar"):
        return "**SILENT FAILURE**" + (" (wrong by the interval)" if record.get("wrong_by_interval") else "")
    return "kept"


def verdict_cell(row: dict, kind: str) -> str:
    record, auto = row["commands"][kind], row["commands"].get(f"{kind}_auto")
    code = record["exit"]
    if code == "timeout":
        text = "timed out"
    elif code == 0:
        return judged_verdict(record) if record["written"] else "**SILENT FAILURE** (exit 0, nothing written)"
    elif code == 1:
        text = f"refused ({', '.join(record['error_codes']) or 'no error finding'})"
        refusal = refusal_class(CASES[row["model"]], record.get("refused_judged"), record["error_codes"]) \
            if record.get("refused_judged") else None
        if refusal:
            text += f", the refused file: {refused_cell(row, record)}, " + (
                f"**{refusal}**" if refusal.startswith("needless") else refusal
            )
        if record["written"]:
            text += ", a file written anyway: " + judged_verdict(record)
    else:
        text = f"exit {code}" + (" with a traceback" if record.get("traceback") else "")
    if auto is None:
        return text
    chosen = (auto.get("auto") or {}).get("chosen_name")
    if auto["exit"] == 0 and auto["written"]:
        text += (f"; --auto: {chosen} written (gate cosine {_num(auto['gate_cosine'])}, decision "
                 f"{gate_decision_cell(row, auto)}), measured {measured_cell(row, auto)}, {judged_verdict(auto)}")
    elif auto["exit"] == "timeout":
        text += "; --auto timed out"
    else:
        text += f"; --auto: none passed (exit {auto['exit']}" + (", traceback" if auto.get("traceback") else "") + ")"
        fp16 = row["commands"].get(f"{kind}_fp16")
        if fp16 is not None:
            text += (
                f", FP16 measured passing; its printed convert: exit {fp16['exit']}, measured "
                f"{measured_cell(row, fp16)}, "
                f"{judged_verdict(fp16) if fp16['written'] else 'nothing written'}"
            )
    return text


def gate_decision_cell(row: dict, record: dict) -> str:
    decisions = record.get("decisions") or []
    if not decisions:
        return "-"
    # the decided output's record; for a model without a decision, the first output the gate decided on
    entry = next((d for d in decisions if d["output"] == row["decision_output_name"]), None) if row["decision"] else \
        next((d for d in decisions if d.get("gated")), None)
    if entry is None:
        return "-"
    if entry.get("ranking"):  # scores a ranking application reads: the gate's best-scored class figures
        ranking = entry["ranking"]
        text = f"{_pct(ranking.get('agreement'))} / {_pct(ranking.get('expected_agreement'))} (best score)"
    else:
        text = f"{_pct(entry.get('agreement'))} / {_pct(entry.get('expected_agreement'))}"
        text += "" if row["decision"] else f" ({entry.get('kind')})"
    if entry.get("region_agreement") is not None:
        text += f"; regions {_pct(entry['region_agreement'])} (asks {_pct(entry.get('required_regions'))})"
    if entry.get("required_scenes") is not None:  # detect: whole scenes, seen / expected
        text += (f"; scenes {_pct(entry.get('scene_agreement'))} / {_pct(entry.get('expected_scene_agreement'))} "
                 f"(asks {_pct(entry['required_scenes'])})")
    return text + ("; failed" if entry.get("passed") is False else "")


def peer_verdict(record: dict) -> str:
    if record["error"] or not record["written"]:
        return f"failed: {(record['error'] or 'nothing written')[:80]}".replace("|", "/")
    return judged_verdict(record)


def kept_cell(record: dict) -> str:
    share = record.get("weight_share")
    return f"{record['excluded_nodes']}" + (f" ({share:.0%})" if share is not None and record.get("written") else "")


def table_rows(rows: list[dict]) -> list[str]:
    lines = [
        "| model | transform | exit | written | gate cosine | gate decision: agreement / expected | "
        "measured on fresh inputs (95% interval) | lowest cosine / norm ratio | bar | verdict | latency int8/float | "
        "nodes kept float (weights integer) | s | peak RSS MB | peer: measured (95% interval) | peer: lowest cosine / "
        "norm ratio | "
        "peer verdict | peer s | peer peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for row in rows:
        if row.get("skipped"):
            lines.append(f"| {row['model']} | - | skipped: {row['skipped']} |" + " |" * 16)
            continue
        name = row["model"] + ("" if row["quantizable"] else " (not quantizable)")
        bar = _pct(row["bar"]) if row["decision"] else "cosine 0.99"
        for kind in ("static", "dynamic"):
            mine, peer = row["commands"][kind], row["commands"][f"peer_{kind}"]
            code = mine["exit"]
            codes = f" ({', '.join(mine['error_codes'])})" if mine["error_codes"] else ""
            lines.append(
                f"| {name} | {kind} | {code}{codes} | {'yes' if mine['written'] else 'no'} | "
                f"{_num(mine['gate_cosine'])} | "
                f"{gate_decision_cell(row, mine)} | {measured_cell(row, mine)} | {cosine_cell(mine)} | {bar} | "
                f"{verdict_cell(row, kind)} | {_num(mine['latency_ratio'], 2)} | {kept_cell(mine)} | "
                f"{mine['seconds']:.0f} | {mine['peak_rss_mb']} | {measured_cell(row, peer)} | {cosine_cell(peer)} | "
                f"{peer_verdict(peer)} | {peer['seconds']:.0f} | {peer['peak_rss_mb']} |"
            )
    return lines


def summary(rows: list[dict]) -> dict:
    done = [r for r in rows if not r.get("skipped")]
    quantizable = [r for r in done if r["quantizable"]]
    figures: dict = {"models": len(rows), "skipped": [r["model"] for r in rows if r.get("skipped")],
                     "quantizable": len(quantizable),
                     "not_quantizable": [f"{r['model']} ({r['why_not']})" for r in done if not r["quantizable"]]}
    for kind in ("static", "dynamic"):
        within = [r for r in quantizable if r["commands"][kind]["exit"] == 0 and r["commands"][kind]["written"]]
        with_auto = [
            r for r in quantizable if r in within or (r["commands"].get(f"{kind}_auto") or {}).get("exit") == 0
        ]
        figures[kind] = {
            "within": len(within),
            "with_auto": len(with_auto),
            "peer_silent": [r["model"] for r in quantizable if r["commands"][f"peer_{kind}"]["silent_failure"]],
            "peer_failed": [r["model"] for r in quantizable if r["commands"][f"peer_{kind}"]["error"]],
        }
    silent, by_interval, refusals = [], [], []
    for r in done:
        for label, record in r["commands"].items():
            if label.startswith("peer"):
                continue
            if record["silent_failure"]:
                silent.append(f"{r['model']} {label.replace('_auto', ' --auto')}")
            if record["exit"] == 0 and record["wrong_by_interval"]:
                by_interval.append(f"{r['model']} {label.replace('_auto', ' --auto')}")
            if label in ("static", "dynamic") and record["exit"] != 0 and r["quantizable"]:
                auto = r["commands"].get(f"{label}_auto") or {}
                chosen = (auto.get("auto") or {}).get("chosen_name") if auto.get("exit") == 0 else None
                passes = chosen is not None and not auto.get("below_bar")
                fp16 = r["commands"].get(f"{label}_fp16")
                fp16_broken = fp16 is not None and not (fp16["exit"] == 0 and fp16["written"])
                if chosen is None and fp16 is not None and not fp16_broken:
                    # --auto wrote nothing but measured FP16 as passing, and QNT017 printed its command:
                    # the file that command writes, judged
                    chosen, passes = "FP16", not fp16.get("below_bar")
                # FP16 is named by the --auto run's QNT017 with its command (the plain refusal points to --auto)
                named = passes and (
                    chosen == "FP16"
                    or chosen.replace(" per channel", "") in remedies_named(record.get("findings") or [])
                )
                names = remedies_named(
                    record.get("findings") or []
                )  # read again: REMEDIES may have changed since the run
                refusals.append(
                    {
                        "model": r["model"],
                        "kind": label,
                        "codes": record["error_codes"],
                        "names": names,
                        "auto_chose": chosen,
                        "auto_holds_bar": passes,
                        "named": named,
                        "measured": refusal_class(
                            CASES[r["model"]], record.get("refused_judged"), record["error_codes"]
                        )
                        if record.get("refused_judged")
                        else None,
                        "fp16_broken": fp16_broken,
                    }
                )
    figures.update(silent=silent, wrong_by_interval=by_interval, refusals=refusals)
    n = len(quantizable)
    figures["accepted"] = (
        bool(n)
        and all(figures[k]["within"] >= 0.9 * n for k in ("static", "dynamic"))
        and not silent
        and all(r["named"] for r in refusals)
    )
    return figures


def summary_lines(label: str, rows: list[dict]) -> list[str]:
    s = summary(rows)
    n = s["quantizable"]

    def frac(k: int) -> str:
        return f"{k}/{n} ({k / n * 100:.0f}%)" if n else "-"

    lines = [f"**{label}**: {s['models']} models, {n} quantizable"
             + (f" (not: {', '.join(s['not_quantizable'])})" if s["not_quantizable"] else "")
             + (f"; skipped: {', '.join(s['skipped'])}" if s["skipped"] else "") + ".", ""]
    for kind in ("static", "dynamic"):
        f = s[kind]
        lines.append(f"- {kind} int8 within the gate (exit 0, written): {frac(f['within'])}; with the --auto retry: "
                     f"{frac(f['with_auto'])}")
    lines.append(f"- ortprep silent failures (exit 0 and below the bar on the fresh inputs, or a file that does not "
                 f"run; every model, --auto retries included): {len(s['silent'])}"
                 + (f" ({', '.join(s['silent'])})" if s["silent"] else ""))
    lines.append(f"- of which wrong by the interval: {len(s['wrong_by_interval'])}"
                 + (f" ({', '.join(s['wrong_by_interval'])})" if s["wrong_by_interval"] else ""))
    refusals = s["refusals"]
    passing = [r for r in refusals if r["auto_holds_bar"]]
    lines.append(
        f"- refusals of quantizable models: {len(refusals)}; where --auto wrote a precision that holds the bar: "
        f"{len(passing)} (FP16 counts where --auto measured it as passing and the convert command it printed "
        f"wrote a file that holds the bar); of those, the refusal's findings name that precision: "
        f"{sum(r['named'] for r in passing)}"
        + (
            " ("
            + "; ".join(
                f"{r['model']} {r['kind']}: {r['auto_chose']}, named: {', '.join(r['names']) or 'nothing'}"
                for r in passing
            )
            + ")"
            if passing
            else ""
        )
    )
    none = [r for r in refusals if not r["auto_holds_bar"]]
    if none:
        groups: dict[str, list[str]] = {}
        for r in none:
            groups.setdefault(", ".join(r["names"]) or "nothing", []).append(f"{r['model']} {r['kind']}")
        lines.append(
            f"- refusals where --auto wrote nothing that holds the bar: {len(none)}; what their findings name: "
            + "; ".join(f"{named}: {', '.join(which)}" for named, which in groups.items())
        )
    broken = [r for r in refusals if r["fp16_broken"]]
    if broken:
        lines.append(f"- --auto measured FP16 as passing but its printed convert wrote nothing: {len(broken)} ("
                     + ", ".join(f"{r['model']} {r['kind']}" for r in broken) + ")")
    measured = [r for r in refusals if r["measured"]]
    for_size = [r for r in measured if r["measured"] == "for size"]
    needless = [r for r in measured if r["measured"] not in ("right", "for size")]
    lines.append(
        f"- refusals measured by their refused file (--keep-failed): {len(measured)} of {len(refusals)}; right "
        f"(the file is below the bar): {len(measured) - len(needless) - len(for_size)}; refused for size alone "
        f"(QNT003, the file holds the bar): {len(for_size)}; needless (refused on accuracy, the file holds "
        f"the bar): {len(needless)}"
        + (
            " ("
            + ", ".join(
                f"{r['model']} {r['kind']} [{', '.join(r['codes'])}]"
                + (", by the interval" if r["measured"].endswith("interval") else "")
                for r in needless
            )
            + ")"
            if needless
            else ""
        )
    )
    for kind in ("static", "dynamic"):
        f = s[kind]
        lines.append(f"- peer {kind} (ORT's defaults): silent failures {len(f['peer_silent'])} of {n}"
                     + (f" ({', '.join(f['peer_silent'])})" if f["peer_silent"] else "")
                     + (f"; no file: {', '.join(f['peer_failed'])}" if f["peer_failed"] else ""))
    lines.append(
        f"- issue 22's point (static and dynamic each >= 90%, 0 silent failures, every refusal names a precision "
        f"that passes): {'met' if s['accepted'] else 'not met'}"
    )
    return lines


def models_table(rows: list[dict]) -> list[str]:
    lines = ["| model | half | float model | quantizable (weighted nodes; quantized ops) | decision | bar |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        if row.get("skipped"):
            lines.append(f"| {row['model']} | {row['half']} | skipped: {row['skipped']} | - | - | - |")
            continue
        detail = f"{row['weighted_nodes']}" + (f"; {', '.join(row['quantized_ops'])}" if row["quantized_ops"] else "")
        lines.append(
            f"| {row['model']} | {row['half']} | {row['float_model']} | {'yes' if row['quantizable'] else 'no'} "
            f"({detail}) | {row['decision'] or 'none: lowest cosine'} | "
            f"{_pct(row['bar']) if row['decision'] else 'cosine 0.99'} |"
        )
    return lines


def report(rows: list[dict], meta: dict) -> str:
    order = {case.name: index for index, case in enumerate(CORPUS)}
    rows = sorted(rows, key=lambda r: (r["half"] != "eval", order.get(r["model"], 999)))
    evaluation = [r for r in rows if r["half"] == "eval"]
    development = [r for r in rows if r["half"] == "dev"]
    states: dict[str, list[str]] = {}
    for row in rows:
        tree = row.get("tree") or {}
        label = f"{tree.get('head')}" + (
            f" with uncommitted changes to {', '.join(tree['uncommitted'])} (digest {tree['digest']})"
            if tree.get("uncommitted")
            else ""
        )
        changed = row.get("tree_after") not in (None, tree)
        states.setdefault(label, []).append(row["model"] + (" (the code changed while it ran)" if changed else ""))
    code = (
        f"ortprep at {next(iter(states))}"
        if len(states) == 1
        else "the ortprep code changed during the run: "
        + "; ".join(f"{label} for {', '.join(models)}" for label, models in states.items())
    )
    lines = [
        f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}; {code}. "
        f"{meta['fresh']} fresh inputs per model (seed {FRESH_SEED}); {meta.get('calib', CALIB)} calibration samples "
        f"(seed {CALIB_SEED}); "
        f"timeout {TIMEOUT:.0f} s per command. Target: the CPU EP.",
        "",
    ]
    lines += models_table(rows)
    for title, group in (("Evaluation half", evaluation), ("Development half", development)):
        if group:
            lines += ["", f"{title}, {len(group)} models:", ""] + table_rows(group)
    for title, group in (("Evaluation half", evaluation), ("Development half", development)):
        if group:
            lines += [""] + summary_lines(title, group)
    return "\n".join(lines) + "\n"
