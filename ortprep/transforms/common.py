"""What every model-to-model step shares: the output path, the reference run, verification,
the atomic write (never a partial or unverified output unless asked), and the report fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto

from ortprep.findings import Finding
from ortprep.model import ModelHandle
from ortprep.report import StepResult
from ortprep.runtime.compare import output_bounds
from ortprep.runtime.feeds import input_specs, load_feeds, random_feeds
from ortprep.runtime.isolated import RunOutcome
from ortprep.options import VerifyOptions
from ortprep.transforms.verify import VerifyResult, model_bytes, node_count, run_model

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
    specs = input_specs(handle.proto)
    if options.inputs is not None:
        return load_feeds(options.inputs, specs), str(options.inputs)
    return random_feeds(specs, seed=0, shapes=options.shapes, dims=options.dims), "random (seed 0)"


def reference_run(original: ModelProto, feeds: dict[str, np.ndarray], report: StepResult) -> RunOutcome | None:
    """Run the original; when it cannot run, say so (the result then goes unverified)."""
    outcome = run_model(original, feeds)
    if outcome.ok:
        outcome.bounds = output_bounds(original)
        return outcome
    report_unverifiable(outcome, report)
    return None


def report_unverifiable(outcome: RunOutcome, report: StepResult) -> None:
    """CNV007: the original does not run, so the result goes unverified."""
    report.add(
        Finding.of(
            "CNV007",
            f"the original model does not run on ONNX Runtime's CPU EP ({outcome.status}: {outcome.message}); "
            "the result cannot be verified against it",
            fix="check it: ortprep check MODEL --ep cpu; pass --inputs FILE.npz if the inputs are the problem",
        )
    )


def reference_with_intermediates(original: ModelProto, feeds: dict[str, np.ndarray], report: StepResult
                                 ) -> tuple[RunOutcome | None, RunOutcome | None]:
    """One run of the original for both the reference outputs and every intermediate tensor (the
    FP16 activation scan reads them): (the full run, the run with graph outputs only), or
    (None, None) when the original does not run (said as CNV007)."""
    import dataclasses

    from ortprep.transforms.verify import float_intermediates, run_with_intermediates

    full = run_with_intermediates(original, feeds, float_intermediates(original))
    if not full.ok:
        report_unverifiable(full, report)
        return None, None
    names = {v.name for v in original.graph.output}
    reference = dataclasses.replace(full, outputs={k: v for k, v in full.outputs.items() if k in names},
                                    bounds=output_bounds(original))
    return full, reference


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
    """Record a verification failure, write the result unless it failed, fill the report."""
    failed = verify_result is not None and not verify_result.passed
    for name, what in (verify_result.degenerate if verify_result is not None else []):
        report.add(Finding.of(
            "VFY001", f"output '{name}' is {what} on the inputs used: cosine similarity means nothing there, so it was "
            "judged by absolute error; these inputs do not exercise it",
            fix="pass real inputs with --inputs FILE.npz (one array per input) to verify on data that moves this output"))
    if failed:
        if not verify_result.loads or verify_result.error:
            what = f"the result does not load or run ({verify_result.error})"
        else:
            what = f"outputs differ (lowest cosine {verify_result.cosine}, max abs diff {verify_result.max_abs_diff})"
        report.add(Finding.of("CNV006", f"verification failed: {what}", fix=failure_fix))
    written = None
    if result is not None and (not failed or options.keep_failed):
        keep_external = True if handle.external_files else None
        written = ModelHandle(proto=result, path=None).save(dest, force=force, external_data=keep_external)
        report.artifacts.append(str(written))
    report.data = {
        "input": str(handle.path),
        "output": str(written) if written else None,
        "transforms": transforms,
        "nodes_before": nodes_before,
        "nodes_after": node_count(result) if result is not None else None,
        "size_before": size_before,
        "size_after": model_bytes(written) if written else None,
        "verify": verify_result.to_record() if verify_result else dict(NOT_VERIFIED),
        "inputs": feed_source,
        **(extra or {}),
    }
    return written
