"""What every model-to-model step shares: the output path, the reference run, verification,
the atomic write (never a partial or unverified output unless asked), and the report fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto

from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, failed_path
from ortprep.report import StepResult
from ortprep.fidelity.gate import VerifyResult, expect
from ortprep.runtime.feeds import FeedChoice, choose_feeds, input_specs
from ortprep.runtime.isolated import RunOutcome
from ortprep.options import VerifyOptions
from ortprep.transforms.verify import model_bytes, node_count, run_model

NOT_VERIFIED = {
    "loads": None,
    "max_abs_diff": None,
    "max_rel_diff": None,
    "cosine": None,
    "passed": None,
    "outputs": [],
    "error": None,
}


def make_feeds(handle: ModelHandle, options: VerifyOptions) -> tuple[dict[str, np.ndarray], str]:
    """The inputs the original and the result are compared on (runtime/feeds.choose_feeds: the
    user's, else the model's own sizes, else common ones, the first the original runs on), and how
    they were chosen. Dims are tried only when verification will use them."""
    choice = feed_choice(handle, options)
    return choice.feeds, choice.how


def feed_choice(handle: ModelHandle, options: VerifyOptions) -> FeedChoice:
    runs = (lambda feeds: run_model(handle.proto, feeds)) if options.verify else None
    return choose_feeds(input_specs(handle.proto), proto=handle.proto, inputs=options.inputs, shapes=options.shapes,
                        dims=options.dims, runs=runs)


def reference_run(original: ModelProto, feeds: dict[str, np.ndarray], report: StepResult,
                  metrics: dict[str, str] | None = None, seeded: bool = False) -> RunOutcome | None:
    """Run the original; when it cannot run, say so (the result then goes unverified)."""
    outcome = run_model(original, feeds)
    if outcome.ok:
        return expect(outcome, original, metrics, seeded)
    report_unverifiable(outcome, report)
    return None


def decision_fix(verify_result, fix: str) -> str:
    """The fix for a failed verification; where a decision failed, also how to say that the
    output is not one the application decides on."""
    names = [d["name"] for d in getattr(verify_result, "decision_failed", [])]
    if not names:
        return fix
    return (
        fix
        + f"; if the application does not read '{names[0]}' as ortprep did, say what it reads: --metric "
          f"{names[0]}=KIND (cosine: none)"
    )


def report_unverifiable(outcome: RunOutcome, report: StepResult) -> None:
    """CNV007: the original does not run on the inputs the step has, so the result cannot be
    verified, and an unverified result is not written (--no-verify writes without verifying)."""
    inputs = outcome.stage == "run"
    report.add(
        Finding.of(
            "CNV007",
            f"the original model does not run on ONNX Runtime's CPU EP ({outcome.status}: {outcome.message}); "
            "the result cannot be verified against it, so nothing is written",
            fix=("give it inputs it runs on: --inputs FILE.npz (one array per input) or --shape NAME=DIMS; "
                 "--no-verify writes the result unverified" if inputs else
                 "check it: ortprep check MODEL --ep cpu; --no-verify writes the result unverified"),
        )
    )


def finish(
    report: StepResult,
    handle: ModelHandle,
    nodes_before: int,
    result: ModelProto | None,
    dest: Path,
    verify_result: VerifyResult | None,
    options: VerifyOptions,
    *,
    force: bool,
    size_before: int,
    transforms: list[dict[str, Any]],
    feed_source: str | None,
    failure_fix: str,
    extra: dict[str, Any] | None = None,
) -> Path | None:
    """Record a verification failure, write the result unless it failed or could not be verified
    (verification asked, no reference: CNV007), fill the report. Without verification (--no-verify)
    the result must still create an ONNX Runtime CPU session before it is written."""
    if verify_result is None and result is not None and not options.verify:
        verify_result = session_check(result, handle, report)
    failed = verify_result is not None and not verify_result.passed
    unverifiable = verify_result is None and options.verify
    if failed and not verify_result.loads:
        failure_fix = (
            "the result does not load in ONNX Runtime: please report it with the model (--keep-failed writes it)"
        )
    for name, what in (verify_result.degenerate if verify_result is not None else []):
        report.add(
            Finding.of(
                "VFY001",
                f"output '{name}' is {what} on the inputs used: cosine similarity means nothing there, so it was "
                "judged by absolute error; these inputs do not exercise it",
                fix="pass real inputs with --inputs FILE.npz (one array per input) to verify on data that moves this "
                    "output",
            )
        )
    # Every output flat on inputs ortprep made up (a detector's map on a small random image): the
    # run compared nothing the model decides, so the result counts as unverified (CNV015), as when
    # the original cannot run: nothing is written, and the user's inputs are the way on.
    flat = {name for name, _ in verify_result.degenerate} if verify_result is not None else set()
    judged = (
        {o.name for o in verify_result.outputs if o.cosine is not None} | flat if verify_result is not None else set()
    )
    if (flat and flat >= judged and verify_result.passed and options.verify
            and getattr(options, "inputs", None) is None):
        unverifiable = True
        report.add(Finding.of(
            "CNV015", f"nothing was verified: every output is flat on the inputs ortprep made ({feed_source}), so the "
            "comparison says nothing about what the model computes on real data; the result is not written",
            fix="pass real inputs: --inputs FILE.npz (one array per input), or --no-verify to write it unverified"))
    if failed:
        what = verify_result.failure_words()
        report.add(Finding.of("CNV006", f"verification failed: {what}", fix=decision_fix(verify_result, failure_fix)))
    written = kept_failed = None
    if result is not None:
        keep_external = True if handle.external_files else None
        if not failed and not unverifiable:
            written = ModelHandle(proto=result, path=None).save(dest, force=force, external_data=keep_external)
            report.artifacts.append(str(written))
        elif options.keep_failed:  # beside -o, never at it: a refusal leaves nothing where the next step reads
            kept_failed = ModelHandle(proto=result, path=None).save(failed_path(dest), force=force,
                                                                  external_data=keep_external)
            report.artifacts.append(str(kept_failed))
    report.data = {
        "input": str(handle.path),
        "output": str(written) if written else None,
        "kept_failed": str(kept_failed) if kept_failed else None,
        "transforms": transforms,
        "nodes_before": nodes_before,
        "nodes_after": node_count(result) if result is not None else None,
        "size_before": size_before,
        "size_after": model_bytes(written or kept_failed) if (written or kept_failed) else None,
        "verify": verify_result.to_record() if verify_result else dict(NOT_VERIFIED),
        "verified": bool(verify_result is not None and verify_result.passed and options.verify),
        "inputs": feed_source,
        **(extra or {}),
    }
    return written


def session_check(proto: ModelProto, handle: ModelHandle, report: StepResult) -> VerifyResult | None:
    """--no-verify: the result is not compared, but it must still create an ONNX Runtime CPU
    session (no run, so no inputs needed); a result that does not load fails like a verification.
    When the original does not create one either (custom ops whose library is not loaded here),
    the check cannot judge: None, said as CNV007."""
    outcome = run_model(proto, [])
    if outcome.ok:
        return VerifyResult(loads=True, passed=True)
    original = run_model(handle.proto, []) if handle.proto is not proto else outcome
    if not original.ok:
        report.add(Finding.of(
            "CNV007", f"--no-verify: neither the original nor the result creates an ONNX Runtime CPU session here "
            f"({original.message}); the result is written without even a session check",
            severity=Severity.WARNING,
            fix="load it where its custom ops are registered: ortprep load MODEL --custom-op-library LIB"))
        return None
    return VerifyResult(loads=False, passed=False, status=outcome.status,
                        error=f"no ONNX Runtime CPU session: {outcome.message}")
