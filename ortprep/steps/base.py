"""The Step protocol: a name, a typed Options dataclass, and one ``run(model, ctx)``.

Every command and every ``[[steps]]`` entry of a pipeline file is one of these; the registry in
``ortprep.steps`` maps names to classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ortprep.model import ModelHandle
from ortprep.options import StepOptions
from ortprep.report import StepResult

ProgressCallback = Callable[[str, int, int], None]


@dataclass
class StepContext:
    """What a step gets besides its options: where to write, and how to report progress."""

    output: Path | None = None  # model-writing steps: the output path (None: the step's default)
    force: bool = False  # allow the output to be the input model
    progress: ProgressCallback | None = None


class Step:
    """Base of every step. Subclasses set ``name`` and ``Options`` and implement ``run``."""

    name: ClassVar[str]
    Options: ClassVar[type[StepOptions]]
    progress_label: ClassVar[str | None] = None  # a spinner label, for steps without a progress bar
    reports_progress: ClassVar[bool] = False  # calls ctx.progress(stage, done, total): a progress bar is drawn
    default_suffix: ClassVar[str] = ".out.onnx"
    needs_ort: ClassVar[str] = "never"  # "always", or "to_verify" (only when options.verify is on)
    memory_factor: ClassVar[float | None] = None  # holds the weights, about this many times: refuse what cannot fit
    refuses_ep_context: ClassVar[bool] = False  # changes the model, so a compiled EPContext model is refused

    def __init__(self, options: StepOptions | None = None) -> None:
        self.options = options if options is not None else self.Options()

    def prepare(self) -> None:
        """Checks of the environment before any work: ONNX Runtime present where the step needs it
        (EnvironmentMissingError, exit 3, with the install line)."""
        if self.needs_ort == "always" or (self.needs_ort == "to_verify" and getattr(self.options, "verify", False)):
            from ortprep.runtime.providers import require_ort

            require_ort()

    def admit(self, model: ModelHandle | None) -> None:
        """The checks every model passes before this step runs: not a compiled EPContext model
        (for steps that change it), a model ONNX Runtime loads, and weights that fit in memory.
        Each refusal is one line (exit 2, or 3 for memory)."""
        if model is not None:
            require_metric_outputs(model, getattr(self.options, "metrics", None) or {}, self.name)
        if model is None or self.memory_factor is None:
            return
        from ortprep.resources import require_memory
        from ortprep.validity import require_valid

        if self.refuses_ep_context:
            refuse_ep_context(model, self.name)
        require_valid(model, self.name)
        factor = self.memory_needed(model)
        if factor is not None:
            require_memory(model, self.name, factor)

    def memory_needed(self, model: ModelHandle) -> float | None:
        """How many times the model's weights this step holds in memory for ``model`` (None: a
        step that streams them, to which no memory limit applies)."""
        return self.memory_factor

    def default_output(self, model: Path) -> Path:
        """Where the output goes when none is given: beside the input, with the step's suffix."""
        return model.with_name(model.name.removesuffix(".onnx") + self.default_suffix)

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        raise NotImplementedError


def require_metric_outputs(model: ModelHandle, metrics: dict[str, str], step: str) -> None:
    """--metric OUTPUT=KIND names outputs of the model: a name that is none is a usage error (a
    misspelt output would otherwise leave the decision it meant to set inferred, silently)."""
    from ortprep.errors import UsageError

    outputs = [value.name for value in model.graph.output]
    unknown = [name for name in metrics if name not in outputs]
    if unknown:
        raise UsageError(f"{step}: --metric names {', '.join(repr(n) for n in unknown)}, not an output of the model",
                         hint="its outputs: " + ", ".join(outputs[:12]) + ("..." if len(outputs) > 12 else ""))


def output_path(step: Step, model: ModelHandle, ctx: StepContext) -> Path:
    """The validated output path of a model-writing step (never the input unless ``force``)."""
    from ortprep.errors import UsageError
    from ortprep.model import check_output_path

    if model.path is None:
        raise UsageError(f"{step.name} needs a model file")
    dest = ctx.output if ctx.output is not None else step.default_output(model.path)
    return check_output_path(dest, input_path=model.path, force=ctx.force)


def refuse_ep_context(handle: ModelHandle, step: str) -> None:
    """Steps that change a model cannot work on a compiled EPContext model (its graph is an EP's binary)."""
    import onnx

    from ortprep.errors import UsageError

    sources = sorted(
        {
            onnx.helper.get_attribute_value(a).decode()
            if isinstance(onnx.helper.get_attribute_value(a), bytes)
            else str(onnx.helper.get_attribute_value(a))
            for node in handle.graph.node
            if node.op_type == "EPContext"
            for a in node.attribute
            if a.name == "source"
        }
    )
    if any(node.op_type == "EPContext" for node in handle.graph.node):
        raise UsageError(
            f"{handle.path} is a compiled EPContext model ({', '.join(sources) or 'an EP'}); {step} cannot "
            "change what is inside it",
            hint=f"run ortprep {step} on the source model, then ortprep compile the result again",
        )
