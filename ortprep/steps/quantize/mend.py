"""Mending a candidate whose session fails on the target EP (``quantize --auto-exclude``).

Where a trial passes on the CPU EP and the target EP's session cannot be built or first run
(QNN's graph finalize: QNN_COMMON_ERROR_MEM_ALLOC; an op its layout transformer leaves), no
keeping in float helps: the EP takes float nodes too, and fails on them. The reduction engine of
``check --prove`` (:func:`ortprep.prove.culprits.reduce_failure`) names the culprit nodes of the
trial's own QDQ file; the fix search (:func:`ortprep.prove.fixes.find_fix`, graph changes only:
the device is the user's) finds which of them, kept off the EP, let the session be created; then
the trial is quantized again with those nodes kept off the EP (:mod:`.off_target`: in If nodes the
CPU EP runs) and judged like every trial. A new failure of the mended file is reduced again, up to
MEND_ROUNDS times. Bound by the step's --search-seconds and --ep-total-seconds.

Where nothing mends it, the record names the culprits (the reduction's result), and the search
does not run: no float set changes what the EP refuses. Measurements:
docs/decisions/mend52-failing-sessions.md.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions
from ortprep.prove.culprits import MAX_PROBES, MAX_SECONDS, reduce_failure
from ortprep.prove.fixes import MAX_FIX_SECONDS, MAX_FIX_SESSIONS, find_fix
from ortprep.prove.reduction import Budget
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.trials import Trial

# Failures of the mended file reduced again (a culprit kept off can uncover the next one).
MEND_ROUNDS = 3
# One probe session's bound, in seconds (a QNN session of a small model builds in about a second
# on the HTP simulator; a large one's finalize takes longer).
PROBE_TIMEOUT = 300.0
# The EP's words where its session was not built or did not run (ep_gate.GateTarget._run): the
# prefix is ortprep's, the rest the EP's own message the reduction matches probes against.
FAILED_STAGES = ("session creation on ", "the run on ")


def session_failure(trials: Trials, trial: Trial) -> tuple[str, bool] | None:
    """(the EP's own message, whether it failed at its first run) where ``trial``'s session on the
    target EP failed while the CPU EP passed it; None otherwise (no EP judged, a crash or a hang,
    the EP's time spent, or outputs judged)."""
    evaluation = trials.evaluations.get(trial.path) if trial.path is not None else None
    on_ep = evaluation.on_ep if evaluation is not None else None
    if on_ep is None or on_ep.error is None or not evaluation.cpu_verdict:
        return None
    for stage in FAILED_STAGES:
        if on_ep.error.startswith(stage):
            _, _, message = on_ep.error.partition(" failed: ")
            return message or on_ep.error, stage == "the run on "
    return None


def mend_session(trials: Trials, source: Path, trial: Trial, options: QuantizeOptions
                 ) -> tuple[Trial, dict[str, Any] | None, dict[str, str]]:
    """``trial`` mended where its session fails on the target EP (see the module's docstring): the
    trial kept (``trial`` itself where none was mended), the record (None where the session did
    not fail: ``mended``, ``rounds`` with each reduction's culprits, fix and trial, ``reason``
    where not mended), and why each node was kept off the EP."""
    failure = session_failure(trials, trial)
    target = trials.target
    if failure is None or target is None or target.runtime is None:
        return trial, None, {}
    from ortprep.prove.proof import session_caller

    ep = target.ep
    record: dict[str, Any] = {"ep": ep, "mended": False, "rounds": [], "kept_off_ep": []}
    reasons: dict[str, str] = {}
    search = Budget(seconds=options.search_seconds, started=trials.started)
    best = trial
    for _ in range(MEND_ROUNDS):
        message, at_run = failure
        clock = target.clock
        left = [s for s in (search.seconds_left(), clock.left() if clock is not None else None) if s is not None]
        if min(left, default=1.0) <= 0:
            record["reason"] = (f"the session on {ep} fails ({_short(message)}) and no time was left to reduce it "
                                "(--search-seconds, --ep-total-seconds)")
            break
        session = session_caller(target.runtime.spec, target.runtime, PROBE_TIMEOUT, run_once=at_run)

        def fails(path: str) -> tuple[bool, str]:
            created, said, _ = session(path, target.provider_options)
            return not created, said

        handle = ModelHandle.open(best.path)
        seconds = min([MAX_SECONDS, *left])
        entry: dict[str, Any] = {"trial": best.label, "message": message}
        record["rounds"].append(entry)
        with tempfile.TemporaryDirectory(prefix="ortprep-mend-") as workdir:
            culprit = _on_clock(clock, lambda: reduce_failure(handle, fails, message=message,
                                                               bound=Budget(MAX_PROBES, seconds)))
            entry["culprit"] = {key: culprit.get(key) for key in ("culprits", "nodes", "probes", "seconds", "stopped",
                                                                  "reason", "partial")
                                if culprit.get(key) is not None}
            if not culprit["culprits"]:
                record["reason"] = (f"the session on {ep} fails ({_short(message)}); the reduction named no culprit: "
                                    + (culprit.get("reason") or culprit.get("stopped") or "none found"))
                break
            fix = _on_clock(clock, lambda: find_fix(
                handle, culprit, session, provider=target.runtime.spec.provider,
                provider_options=target.provider_options, ep_label=ep, workdir=workdir, kinds=("graph",),
                keep_device=True, bound=Budget(MAX_FIX_SESSIONS, min(MAX_FIX_SECONDS, seconds)),
                timeout=PROBE_TIMEOUT))
        entry["fix"] = {key: fix.get(key) for key in ("kind", "kept_off", "pruned", "sessions", "seconds", "reason",
                                                      "stopped") if fix.get(key) is not None}
        names = culprit_names(culprit)
        if fix.get("kind") != "graph":
            record["reason"] = (f"the session on {ep} fails ({_short(message)}) at {', '.join(names[:6])}; keeping "
                                f"them off {ep} did not let it be created: {fix.get('reason') or 'no fix'}")
            break
        off = list(dict.fromkeys([*best.off, *fix["kept_off"]]))
        outcome = trials.attempt(source, list(best.kept), f"off {ep}: the culprits of its failing session "
                                 f"({', '.join(fix['kept_off'][:4])})", off=off)
        entry["trial_after"] = {"label": outcome.label, "cosine": outcome.cosine, "passed": outcome.passed,
                                "error": outcome.error}
        if outcome.path is None:
            record["reason"] = f"quantizing with {', '.join(fix['kept_off'][:4])} off {ep} failed: {outcome.error}"
            break
        why = (f"the session on {ep} failed ({_short(message)}); the reduction named it among the culprits "
               f"({culprit['probes']} probe sessions) and the session is created with it off {ep}")
        reasons.update({name: why for name in fix["kept_off"]})
        best = outcome
        failure = session_failure(trials, outcome)
        if failure is None:
            record["mended"] = not _ep_error(trials, outcome)
            if not record["mended"]:
                record["reason"] = f"with {', '.join(off[:6])} off {ep}: {outcome.error}"
            break
    else:
        record["reason"] = f"the session on {ep} still fails after {MEND_ROUNDS} reductions: {_short(failure[0])}"
    record["kept_off_ep"] = list(best.off) if best is not trial else []
    record["culprits"] = list(dict.fromkeys(name for entry in record["rounds"]
                                            for name in culprit_names(entry.get("culprit") or {})))
    return (best if record["mended"] else trial), record, (reasons if record["mended"] else {})


def culprit_names(culprit: dict[str, Any]) -> list[str]:
    """Every node of the reduction's culprit sets, in order."""
    return list(dict.fromkeys(name for group in culprit.get("culprits") or [] for name in group["nodes"]))


def mend_finding(record: dict[str, Any] | None, nodes_on_ep: dict | None = None) -> Finding | None:
    """QNT040: what the mend did (the session mended, the nodes kept off the EP and how much stays
    on it), or the culprits the reduction named where nothing mended it."""
    if not record:
        return None
    ep = record["ep"]
    culprits = record.get("culprits") or []
    shown = ", ".join(culprits[:8]) + (", ..." if len(culprits) > 8 else "")
    if record["mended"]:
        kept = record["kept_off_ep"]
        share = ""
        if nodes_on_ep and nodes_on_ep.get("nodes_total"):
            share = (f"; {nodes_on_ep['nodes_on_ep']} of {nodes_on_ep['nodes_total']} nodes stay on {ep} "
                     f"({nodes_on_ep['nodes_on_ep'] / nodes_on_ep['nodes_total']:.0%})")
        return Finding.of(
            "QNT040", f"the session on {ep} failed ({_short(record['rounds'][0]['message'])}); the reduction named "
            f"{shown}, and with {len(kept)} node(s) kept off {ep} ({', '.join(kept[:8])}) it is created and "
            f"judged{share}", ep=ep, severity=Severity.INFO,
            fix=f"nothing to do; ortprep load MODEL --ep {ep} shows what runs where")
    return Finding.of(
        "QNT040", f"not mended: {record.get('reason', 'the session on ' + ep + ' fails')}"
        + (f" (culprits the reduction named: {shown})" if shown else ""), ep=ep, severity=Severity.WARNING,
        fix=f"ortprep check MODEL.qdq.onnx --ep {ep} --prove measures it alone; another --device or precision "
            "(--auto), or FP16")


def mend_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What --auto's list of attempts keeps of an attempt's mend: mended or not, the culprits, the
    nodes kept off the EP."""
    if not record:
        return None
    return {"mended": record["mended"], "culprits": record.get("culprits") or [],
            "kept_off_ep": record.get("kept_off_ep") or [], "reason": record.get("reason")}


def mend_words(summary: dict[str, Any] | None) -> str:
    """QNT017's words for an attempt whose session failed on the EP and was not mended."""
    if not summary or summary["mended"]:
        return ""
    culprits = summary["culprits"]
    named = ", ".join(culprits[:4]) + (", ..." if len(culprits) > 4 else "")
    return "; its session fails on the EP" + (f", culprits {named} not mended" if named else "")


def _ep_error(trials: Trials, trial: Trial) -> bool:
    evaluation = trials.evaluations.get(trial.path) if trial.path is not None else None
    # not judged on the EP at all (a candidate the CPU EP fails never reaches it) is not a session
    # shown to build there: not mended
    return evaluation is None or evaluation.on_ep is None or evaluation.on_ep.error is not None


def _on_clock(clock, work):
    """``work()`` counted on the step's time on the EP (--ep-total-seconds), where it has one."""
    return work() if clock is None else clock.timed(work)


def _short(message: str, limit: int = 160) -> str:
    text = " ".join((message or "").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
