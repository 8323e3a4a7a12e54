"""A package's request: its targets (each EP's variant kind and device), and the options
every variant is made with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ortprep.errors import UsageError
from ortprep.report import RunReport

SCHEMA = "ortprep.package/1"
LOAD_SCHEMA = "ortprep.load-package/1"
COMPONENT = "model"
MODEL_FILE = "model.onnx"
# what a target's variant is made of
KIND_BY_EP = {
    "cpu": "float", "xnnpack": "float", "openvino-cpu": "float", "openvino-gpu": "float", "openvino-npu": "float",
    "coreml": "float", "nnapi": "float",
    "cuda": "fp16", "tensorrt": "fp16", "dml": "fp16", "dml-npu": "fp16",
    "qnn": "qdq",
}
# ORT's variant device kinds (cpu | gpu | npu); None: the variant names no device, and ORT matches
# it by EP name alone. QNN names none (docs/decisions/seams-package-device-kinds.md): the SoC it is
# for is in its compatibility string and its provider options.
DEVICE_BY_EP = {
    "cpu": "cpu", "xnnpack": "cpu", "openvino-cpu": "cpu", "openvino-gpu": "gpu", "openvino-npu": "npu",
    "cuda": "gpu", "tensorrt": "gpu", "dml": "gpu", "dml-npu": "npu", "qnn": None, "coreml": None, "nnapi": None,
}
COMPILED = ("qnn",)  # targets whose variant is also compiled to an EPContext model


@dataclass
class PackageTarget:
    name: str  # the variant's name
    ep: str  # canonical EP name
    device: str | None = None  # QNN: the SoC (--device)
    runtime: Path | None = None  # another environment's Python for this EP


def targets_from(given: list[str], *, config: Path | None = None, device: str | None = None,
                 runtimes: dict[str, Path] | None = None) -> list[PackageTarget]:
    """The targets of a package: a repository config's [targets] (their ep, device and runtime),
    then ``given`` ("EP" or "NAME=EP"). ``device`` (QNN's SoC) goes to the targets whose EP has
    devices and names none of its own; ``runtimes`` (EP or target name -> Python) to the rest."""
    from ortprep.eps.devices import has_devices
    from ortprep.eps.registry import resolve_ep

    targets: list[PackageTarget] = []
    if config is not None:
        from ortprep.config import is_repo_config, parse_repository, read_raw

        raw, text = read_raw(config)
        if not is_repo_config(raw):
            raise UsageError(f"{config} has no [targets]", hint="use a repository config, or pass --target EP")
        # package uses the [targets] alone: a config without [[models]] or [[steps]] is complete for it
        read = parse_repository(raw, text, targets_only=True)
        targets += [PackageTarget(t.name, t.ep, t.device, t.runtime) for t in read.targets]
    for text in given:
        label, _, ep = text.partition("=")
        targets.append(PackageTarget(label.strip(), (ep or label).strip()))
    for target in targets:
        target.ep = resolve_ep(target.ep).name
        if has_devices(target.ep):
            target.device = target.device or device
        else:
            target.device = None
        target.runtime = target.runtime or (runtimes or {}).get(target.ep) or (runtimes or {}).get(target.name)
    return targets


@dataclass
class PackageOptions:
    targets: list[PackageTarget]
    calib: str | Path | None = None  # quantize's calibration data (QNN targets)
    inputs: Path | None = None  # verification / load inputs (.npz)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)
    min_cosine: float | None = None
    compile: bool = True
    name: str | None = None
    version: str | None = None
    force: bool = False
    timeout: float = 300.0


@dataclass
class VariantOutcome:
    target: PackageTarget
    kind: str
    report: RunReport | None = None
    compile_report: RunReport | None = None
    files: dict[str, Path] = field(default_factory=dict)  # variant name -> model file (staged)

    @property
    def failed(self) -> bool:
        return self.report is None or any(step.status == "failed" for step in self.report.steps)
