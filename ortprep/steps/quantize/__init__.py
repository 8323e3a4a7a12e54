"""quantize: static (real calibration data) or dynamic, with EP presets and an accuracy verdict.

The step and its modules, in the order an attempt runs them:

- ``presets`` (the settings), ``prepare`` (refusals, the graph ORT's quantizer gets), ``calibrate``
  (the data and the quantizer's child process);
- ``outcome`` (the baseline, the remedies, the search, the selection): ``runner`` runs trials,
  ``trials`` compares them, ``search`` wires ``strategy`` and ``float_end`` (which nodes to keep
  float, on the reduction engine of :mod:`ortprep.prove.reduction`), ``moves`` (which to keep off
  the target EP), ``remedies`` (calibration method, rounding, compute);
- ``evaluate`` and ``ep_gate`` (the gate on the CPU EP and on the target EP), ``findings`` and
  ``record`` (the report); ``attempt`` (:func:`quantize_model`) orchestrates one attempt;
- ``ladder`` and ``auto`` (``--auto``: the precisions in order), ``fp16_probe`` (FP16 by the same
  gate where none passes).

Graph-only QDQ work lives in :mod:`ortprep.transforms.qdq`. The quantizer runs in a child process
whose working directory is a private temp folder: a crash stays there, and so does every temp file.
"""

from __future__ import annotations

from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.runtime.budget import timing_step
from ortprep.steps.base import Step, StepContext, output_path
from ortprep.steps.quantize.attempt import quantize_model
from ortprep.steps.quantize.auto import quantize_auto

__all__ = ["QuantizeStep", "quantize_auto", "quantize_model"]


class QuantizeStep(Step):
    """The "quantize" step: :func:`quantize_model` on the pipeline's model."""

    name = "quantize"
    Options = QuantizeOptions
    memory_factor = 2.0
    refuses_ep_context = True
    reports_progress = True
    needs_ort = "always"
    default_suffix = ".int8.onnx"

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        # one ledger for the step: where its time goes (the report's "timing"), and the target EP's
        # outputs each (file, sample) is run for once (runtime/budget.py StepTimes)
        with timing_step(ctx.progress, seconds=self.options.step_seconds) as times:
            if self.options.auto:
                report = quantize_auto(model, output_path(self, model, ctx), self.options, force=ctx.force,
                                       progress=ctx.progress)
            else:
                report = quantize_model(model, output_path(self, model, ctx), self.options, force=ctx.force,
                                        progress=ctx.progress)
        if isinstance(report.data, dict):
            # the engines' own seconds (the attempt's record) beside the step's ledger
            engine = (report.data.get("timing") or {}).get("engine_seconds", 0.0)
            report.data["timing"] = {**times.record(), "engine_seconds": engine}
        return report
