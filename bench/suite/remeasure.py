"""The files a yield run wrote, judged again on many more fresh inputs than the run had.

quantize_yield.py judges each written file on 100 fresh inputs: enough to see a file far below its
bar, not to tell a file at 97.8% from one at 98% (the 95% interval of 96/100 spans 90%-98%). A
silent failure by that point estimate may be a file at its bar, and a file that holds the bar
there may not. This script takes every file one yield run wrote with exit 0 (ortprep's own: the
plain command and its --auto retry; --peers adds ORT's calls, --fp16 the FP16 converts --auto
printed) and judges it by quantize_yield's rules (its judge, below_bar and wrong_by_interval: the
application's decision on the case's decision output with a 95% Wilson interval; a model without
one by its lowest cosine), on N fresh inputs (default 1,000, seed 29, which no other script uses;
--seed draws another set) against the float model the run quantized, in batches of BATCH inputs
(a page-sized model's 1,000 inputs would not fit in memory at once).

    .venv/bin/python -m bench.suite.remeasure [--yield-out bench/out/quantize_yield] [-n 1000] [--seed 29]
                                        [--half eval|dev|all] [--only NAME ...] [--peers] [--fp16]

A file is "below the bar" where its point estimate is, "wrong by the interval" where the whole
interval is. Results: YIELD_OUT/remeasure_seedSEED[_FILTERS].json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.paths import OUT
from bench.referee import BARS, below_bar, wilson, wrong_by_interval
from bench.referee import COSINE_GATE as COSINE_BAR
from bench.suite.quantize_yield import cpu_session, judge, run_all
from bench.suite.quantize_yield_report import CASES

SEED = 29
BATCH = 100


def written(row: dict, peers: bool, fp16: bool) -> list[str]:
    """The labels of the commands of ``row`` that wrote a file with exit 0, in the run's order."""
    labels = []
    for label, record in (row.get("commands") or {}).items():
        if not record or record.get("exit") != 0 or not record.get("written"):
            continue
        if label.startswith("peer") and not peers or label.endswith("_fp16") and not fp16:
            continue
        labels.append(label)
    return labels


def run_root(yield_out: Path, row: dict, label: str) -> Path:
    """The tree the yield run ran in: its files are named from there (bench/out/quantize_yield/...)."""
    named = Path(row["commands"][label]["file"])
    here = (yield_out / row["model"] / named.name).resolve()
    return here.parents[len(named.parts) - 1]


def merged(parts: list[dict]) -> dict:
    """One judgement from the judgements of consecutive batches."""
    if not all(part.get("runs") for part in parts):
        return next(part for part in parts if not part.get("runs"))
    agree, samples = sum(p["agree"] for p in parts), sum(p["samples"] for p in parts)
    cosines = [p["lowest_cosine"] for p in parts if p["lowest_cosine"] is not None]
    return {"loads": True, "runs": True, "samples": samples, "agree": agree, "interval": list(wilson(agree, samples)),
            "lowest_cosine": min(cosines) if cosines else None, "nonfinite": any(p["nonfinite"] for p in parts),
            "samples_at_cosine_bar": sum(p["samples_at_cosine_bar"] for p in parts)}


def verdict(case, judged: dict | None) -> str | None:
    if judged is None:
        return None
    if not judged.get("runs"):
        return "does not run"
    if wrong_by_interval(case, judged):
        return "wrong by the interval"
    return "below the bar" if below_bar(case, judged) else "holds the bar"


def figure(case, judged: dict | None) -> str:
    if not judged:
        return "-"
    if not judged.get("runs"):
        return judged.get("error", "does not run")
    if not case.decision:
        cosine = "n/a" if judged["lowest_cosine"] is None else f"{judged['lowest_cosine']:.4f}"
        return f"lowest cosine {cosine} ({judged['samples_at_cosine_bar']}/{judged['samples']} at {COSINE_BAR})"
    low, high = judged["interval"]
    return f"{judged['agree']}/{judged['samples']} ({low:.1%}-{high:.1%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yield-out", type=Path, default=OUT / "quantize_yield")
    parser.add_argument("-n", type=int, default=1000, help="fresh inputs per model (default 1,000)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the fresh inputs' seed (default {SEED})")
    parser.add_argument("--half", choices=["eval", "dev", "all"], default="all")
    parser.add_argument("--only", nargs="*", help="model names")
    parser.add_argument("--peers", action="store_true", help="ORT's own files too")
    parser.add_argument("--fp16", action="store_true", help="the FP16 converts --auto printed too")
    args = parser.parse_args()
    unknown = set(args.only or []) - set(CASES)
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    saved = json.loads((args.yield_out / "results.json").read_text())
    started = time.perf_counter()
    records = []
    for row in saved["rows"]:
        case = CASES.get(row["model"])
        labels = written(row, args.peers, args.fp16)
        if (case is None or not labels or args.half not in ("all", row["half"])
                or args.only and row["model"] not in args.only):
            continue
        source = run_root(args.yield_out, row, labels[0]) / row["float_model"]
        if not source.exists():
            parser.error(f"{row['model']}: the float model the run quantized is not at {source}")
        float_session = cpu_session(source)
        rng = np.random.default_rng(args.seed)
        paths = {label: args.yield_out / row["model"] / Path(row["commands"][label]["file"]).name for label in labels}
        parts: dict[str, list[dict]] = {label: [] for label in labels}
        sessions = {}  # one session a file for every batch
        for label, path in paths.items():
            try:
                sessions[label] = cpu_session(path)
            except Exception as error:  # noqa: BLE001 - a file that does not load is the finding
                parts[label].append({"loads": False, "error": " ".join(str(error).split())[:300]})
        for start in range(0, args.n, BATCH):
            feeds = [{k: np.ascontiguousarray(v) for k, v in case.inputs(rng, i).items()}
                     for i in range(start, min(args.n, start + BATCH))]
            reference = run_all(float_session, feeds)
            for label, session in sessions.items():
                parts[label].append(judge(case, paths[label], reference, feeds, session))
            del feeds, reference
        del sessions
        for label in labels:
            judged, before = merged(parts[label]), row["commands"][label].get("judged")
            record = {"model": row["model"], "half": row["half"], "command": label,
                      "file": str(paths[label]),
                      "bar": BARS[case.decision] if case.decision else COSINE_BAR, "before": before, "now": judged,
                      "verdict_before": verdict(case, before), "verdict_now": verdict(case, judged)}
            records.append(record)
            print(
                f"  {row['model']} {label}: {figure(case, before)} -> {figure(case, judged)}, {record['verdict_now']}",
                file=sys.stderr,
                flush=True,
            )
    seconds = round(time.perf_counter() - started, 1)
    meta = {"fresh": args.n, "seed": args.seed, "half": args.half, "only": args.only, "seconds": seconds,
            "yield_meta": saved.get("meta")}
    name = f"remeasure_seed{args.seed}" + (f"_{args.half}" if args.half != "all" else "") + \
        ("_" + "_".join(sorted(args.only)) if args.only else "")
    (args.yield_out / f"{name}.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1, default=str))
    lines = [
        f"{args.n} fresh inputs per model (seed {args.seed}), {seconds:.0f} s; the yield run's own figure is on "
        f"{(saved.get('meta') or {}).get('fresh', 100)} (seed 23).",
        "",
        "| model | half | command | bar | the yield run's figure | verdict then | on the new inputs | verdict now |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        case = CASES[r["model"]]
        bar = f"{r['bar']:.0%}" if case.decision else f"cosine {r['bar']}"
        lines.append(f"| {r['model']} | {r['half']} | {r['command']} | {bar} | {figure(case, r['before'])} | "
                     f"{r['verdict_before'] or '-'} | {figure(case, r['now'])} | {r['verdict_now']} |")
    for half in ("eval", "dev"):
        group = [r for r in records if r["half"] == half and not r["command"].startswith("peer")]
        if group:
            below = [f"{r['model']} {r['command']}" for r in group if r["verdict_now"] != "holds the bar"]
            wrong = [
                f"{r['model']} {r['command']}"
                for r in group
                if r["verdict_now"] in ("wrong by the interval", "does not run")
            ]
            lines += [
                "",
                f"- {half}: {len(group)} ortprep files; below the bar now: {len(below)}"
                + (f" ({', '.join(below)})" if below else "")
                + f"; wrong by the interval or not running: {len(wrong)}"
                + (f" ({', '.join(wrong)})" if wrong else ""),
            ]
    text = "\n".join(lines) + "\n"
    (args.yield_out / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
