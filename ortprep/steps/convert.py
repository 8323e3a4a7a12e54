"""convert: FP16 (with repair and mixed precision), opset, static shapes, 1-D to 2-D; every
result verified against the original before it is written (transforms/conversion.py does it)."""

from __future__ import annotations

from pathlib import Path

from ortprep.model import ModelHandle
from ortprep.options import ConvertOptions
from ortprep.report import StepResult
from ortprep.steps.base import Step, StepContext, output_path
from ortprep.transforms import fp16_stream
from ortprep.transforms.conversion import convert_model


class ConvertStep(Step):
    name = "convert"
    Options = ConvertOptions
    memory_factor = 2.0
    refuses_ep_context = True
    needs_ort = "to_verify"
    progress_label = "converting"

    def default_output(self, model: Path) -> Path:
        suffix = ".fp16.onnx" if self.options.fp16 else ".converted.onnx"
        return model.with_name(model.name.removesuffix(".onnx") + suffix)

    def memory_needed(self, model: ModelHandle) -> float | None:
        # the streamed path holds one chunk of the weights at a time
        return None if fp16_stream.streams(model, self.options) else self.memory_factor

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return convert_model(model, output_path(self, model, ctx), self.options, force=ctx.force)
