"""optimize: ONNX Runtime's offline graph optimization, written beside the output and verified."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx

from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle
from ortprep.report import StepResult
from ortprep.runtime.isolated import run_isolated
from ortprep.steps.base import Step, StepContext, output_path
from ortprep.options import OptimizeOptions
from ortprep.transforms.common import finish, make_feeds, reference_run
from ortprep.fidelity.gate import Gate, VerifyResult, judge_run
from ortprep.transforms.verify import model_bytes, node_count, run_model, save_temp

log = logging.getLogger(__name__)

SCHEMA = "ortprep.optimize/1"
# Fusions reorder float arithmetic: a little looser than simplify's gate.
OPTIMIZE_GATE = Gate(min_cosine=0.99999, max_abs=1e-3, degenerate_tol=1e-3)


def optimize_model(handle: ModelHandle, dest: Path, options: OptimizeOptions, *, force: bool = False) -> StepResult:
    """ORT's offline optimization of ``handle``'s model; writes ``dest`` when verification passes."""
    report = StepResult(step="optimize", schema=SCHEMA)
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
                    f"ONNX Runtime could not optimize the model ({outcome.status}: {outcome.message})",
                    severity=Severity.ERROR,
                    fix="check the model first: ortprep check MODEL --ep cpu",
                )
            )
            finish(report, handle, node_count(original), None, dest, None, options, force=force,
                   size_before=size_before, transforms=[], feed_source=None, failure_fix="")
            return report
        proto = onnx.load(str(target))  # loads ORT's external data from the temp folder
    feeds, feed_source = make_feeds(handle, options)
    verify_result: VerifyResult | None = None
    if options.verify:
        reference = reference_run(original, feeds, report, options.metrics, options.inputs is None)
        if reference is not None:
            verify_result = judge_run(reference, run_model(proto, feeds), OPTIMIZE_GATE)
    report.output = finish(
        report,
        handle,
        node_count(original),
        proto,
        dest,
        verify_result,
        options,
        force=force,
        size_before=size_before,
        transforms=[{"transform": "ort-optimize", "detail": f"level {options.level}"}],
        feed_source=feed_source,
        failure_fix="use a lower --level",
        extra={"level": options.level},
    )
    return report


class OptimizeStep(Step):
    name = "optimize"
    Options = OptimizeOptions
    memory_factor = 2.0
    refuses_ep_context = True
    needs_ort = "always"
    progress_label = "optimizing"

    def default_output(self, model: Path) -> Path:
        return model.with_name(model.name.removesuffix(".onnx") + f".opt-{self.options.level}.onnx")

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return optimize_model(model, output_path(self, model, ctx), self.options, force=ctx.force)
