"""optimize: ONNX Runtime's offline graph optimization, written beside the output and verified."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import ModelProto

from ortprep.errors import UsageError
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, check_output_path
from ortprep.report import StepReport
from ortprep.runtime.isolated import run_isolated
from ortprep.steps.transform import VerifyOptions, default_output, finish, make_feeds, reference_run
from ortprep.steps.verify import Gate, VerifyResult, model_bytes, node_count, run_model, save_temp, verify_run

log = logging.getLogger(__name__)

SCHEMA = "ortprep.optimize/1"
LEVELS = ("basic", "extended", "all")
# Fusions reorder float arithmetic: a little looser than simplify's gate.
OPTIMIZE_GATE = Gate(min_cosine=0.99999, max_abs=1e-3)


@dataclass
class OptimizeOptions(VerifyOptions):
    level: str = "extended"


def optimize_model(handle: ModelHandle, output: Path | None, options: OptimizeOptions) -> tuple[StepReport, ModelProto | None]:
    if options.level not in LEVELS:
        raise UsageError(f"unknown optimization level '{options.level}'", hint="use basic, extended or all")
    if handle.path is None:
        raise UsageError("optimize needs a model file")
    dest = check_output_path(
        Path(output) if output else default_output(handle.path, f".opt-{options.level}.onnx"),
        input_path=handle.path,
        force=options.force,
    )
    report = StepReport(step="optimize", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    if options.level == "all":
        report.add(
            Finding.of(
                "OPT001",
                "level 'all' adds layout optimizations for this machine's CPU (NCHWc, ISA-specific kernels); the "
                "output may load only with the CPU EP on a machine like this one",
                fix="ship --level extended output, or optimize on the target machine",
            )
        )
    handle.load_weights()
    original = handle.proto
    with tempfile.TemporaryDirectory(prefix="ortprep-optimize-") as tmp:
        folder = Path(tmp)
        source = save_temp(original, folder, "source.onnx")
        target = folder / "optimized.onnx"
        outcome = run_isolated(
            source, {}, optimization=options.level, optimized_model=target, optimized_data="optimized.onnx.data"
        )
        if not outcome.ok:
            report.add(
                Finding.of(
                    "OPT002",
                    f"ONNX Runtime could not optimize the model ({outcome.status}: {outcome.message[:300]})",
                    severity=Severity.ERROR,
                    fix="check the model first: ortprep check MODEL --ep cpu",
                )
            )
            finish(report, handle, node_count(original), None, dest, None, options, size_before=size_before,
                   transforms=[], feed_source=None, failure_fix="")
            return report, None
        proto = onnx.load(str(target))  # loads ORT's external data from the temp folder
    feeds, feed_source = make_feeds(handle, options)
    verify_result: VerifyResult | None = None
    if options.verify:
        reference = reference_run(original, feeds, report)
        if reference is not None:
            verify_result = verify_run(reference, run_model(proto, feeds), OPTIMIZE_GATE)
    finish(
        report,
        handle,
        node_count(original),
        proto,
        dest,
        verify_result,
        options,
        size_before=size_before,
        transforms=[{"transform": "ort-optimize", "detail": f"level {options.level}"}],
        feed_source=feed_source,
        failure_fix="use a lower --level",
        extra={"level": options.level},
    )
    return report, proto
