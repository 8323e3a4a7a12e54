"""Execution providers ortprep knows: names, aliases, ORT provider names, devices."""

from __future__ import annotations

from dataclasses import dataclass

from ortprep.errors import UsageError


@dataclass(frozen=True)
class EpSpec:
    name: str
    provider: str  # ORT's provider name
    device: str  # "cpu", "gpu" or "npu": where the EP's kernels run
    description: str
    aliases: tuple[str, ...] = ()
    static_shapes: str | None = None  # None, or the severity ("error"/"warning") of dynamic input dims

    @property
    def table_name(self) -> str:
        return self.name


EPS: tuple[EpSpec, ...] = (
    EpSpec("cpu", "CPUExecutionProvider", "cpu", "ONNX Runtime's default CPU kernels"),
    EpSpec("cuda", "CUDAExecutionProvider", "gpu", "NVIDIA GPUs through CUDA/cuDNN kernels"),
    EpSpec("tensorrt", "TensorrtExecutionProvider", "gpu", "NVIDIA TensorRT engines", aliases=("trt",)),
    EpSpec("dml", "DmlExecutionProvider", "gpu", "DirectML on Windows GPUs", aliases=("directml",)),
    EpSpec(
        "dml-npu",
        "DmlExecutionProvider",
        "npu",
        "DirectML on Windows NPUs (compute-only devices)",
        static_shapes="error",
    ),
    EpSpec("openvino-cpu", "OpenVINOExecutionProvider", "cpu", "OpenVINO on Intel CPUs", aliases=("openvino",)),
    EpSpec("openvino-gpu", "OpenVINOExecutionProvider", "gpu", "OpenVINO on Intel GPUs"),
    EpSpec("openvino-npu", "OpenVINOExecutionProvider", "npu", "OpenVINO on Intel NPUs", static_shapes="warning"),
    EpSpec("qnn", "QNNExecutionProvider", "npu", "Qualcomm QNN, HTP (NPU) backend", static_shapes="error"),
    EpSpec("coreml", "CoreMLExecutionProvider", "npu", "Apple CoreML (MLProgram format)", static_shapes="warning"),
    EpSpec("nnapi", "NnapiExecutionProvider", "npu", "Android NNAPI", static_shapes="warning"),
    EpSpec("xnnpack", "XnnpackExecutionProvider", "cpu", "XNNPACK CPU kernels (mobile, web)", static_shapes="warning"),
)

_BY_NAME = {spec.name: spec for spec in EPS} | {alias: spec for spec in EPS for alias in spec.aliases}


def valid_names() -> list[str]:
    return [spec.name for spec in EPS] + [alias for spec in EPS for alias in spec.aliases]


def resolve_ep(name: str) -> EpSpec:
    """EpSpec for a name or alias (case-insensitive); UsageError listing the valid names otherwise."""
    spec = _BY_NAME.get(name.strip().lower())
    if spec is None:
        raise UsageError(
            f"unknown execution provider '{name}'",
            hint="use one of: " + ", ".join(valid_names()),
        )
    return spec


def resolve_target(text: str) -> tuple[EpSpec, ...]:
    """'openvino-cpu,dml' -> the priority list of one session (CPU is always implied last)."""
    names = [part for part in text.split(",") if part.strip()]
    if not names:
        raise UsageError("empty --ep value", hint="use one of: " + ", ".join(valid_names()))
    return tuple(resolve_ep(name) for name in names)
