"""simplify: onnxsim, then onnxoptimizer's fuse-and-eliminate passes; verified with a tight gate.

onnxsim cannot take models over 2 GB, models with custom ops it cannot run, or models whose
shapes it cannot infer; then what can be done is done, and the report names the path taken."""

from __future__ import annotations

import logging
from pathlib import Path


from ortprep.findings import Finding
from ortprep.model import ModelHandle
from ortprep.report import StepResult
from ortprep.steps.base import Step, StepContext, output_path
from ortprep.options import SimplifyOptions
from ortprep.transforms.common import finish, make_feeds, reference_run
from ortprep.transforms.simplify import run_onnxoptimizer, run_onnxsim
from ortprep.fidelity.gate import EXACT_GATE, VerifyResult, judge_run
from ortprep.transforms.verify import model_bytes, node_count, run_model

log = logging.getLogger(__name__)

SCHEMA = "ortprep.simplify/1"


def simplify_model(handle: ModelHandle, dest: Path, options: SimplifyOptions, *, force: bool = False) -> StepResult:
    """onnxsim and onnxoptimizer on ``handle``'s model; writes ``dest`` when verification passes."""
    report = StepResult(step="simplify", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    handle.load_weights()
    original = handle.proto
    nodes_before = node_count(original)
    feeds, feed_source = make_feeds(handle, options)
    reference = (
        reference_run(original, feeds, report, options.metrics, options.inputs is None) if options.verify else None
    )
    proto = original  # onnxsim and onnxoptimizer return new models
    path_taken: list[dict[str, str]] = []
    if options.onnxsim:
        simplified, why = run_onnxsim(proto, handle)
        if simplified is not None:
            proto = simplified
            path_taken.append({"transform": "onnxsim", "detail": "constant folding, shape inference, onnxsim's "
                                                                 "optimizations"})
        else:
            path_taken.append({"transform": "onnxsim skipped", "detail": why})
            report.add(
                Finding.of(
                    "SIM001",
                    f"onnxsim could not simplify the model ({why}); continuing with onnxoptimizer's passes only",
                    fix="nothing needed; for custom ops, simplify a model without them or register their library",
                )
            )
    if options.onnxoptimizer:
        optimized, why = run_onnxoptimizer(proto, list(options.skip_passes))
        if optimized is not None:
            proto = optimized
            path_taken.append({"transform": "onnxoptimizer", "detail": "fuse and eliminate passes"})
        else:
            path_taken.append({"transform": "onnxoptimizer skipped", "detail": why})
            report.add(Finding.of("SIM001", f"onnxoptimizer could not run ({why})", fix="nothing needed"))
    verify_result: VerifyResult | None = None
    if reference is not None:
        verify_result = judge_run(reference, run_model(proto, feeds), EXACT_GATE)
    report.output = finish(
        report,
        handle,
        nodes_before,
        proto,
        dest,
        verify_result,
        options,
        force=force,
        size_before=size_before,
        transforms=path_taken,
        feed_source=feed_source,
        failure_fix="rerun with --skip-pass NAME for the pass that changes results, or --no-onnxsim",
    )
    return report


class SimplifyStep(Step):
    name = "simplify"
    Options = SimplifyOptions
    memory_factor = 2.0
    refuses_ep_context = True
    needs_ort = "to_verify"
    progress_label = "simplifying"
    default_suffix = ".sim.onnx"

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return simplify_model(model, output_path(self, model, ctx), self.options, force=ctx.force)
