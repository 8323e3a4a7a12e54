"""Model packages: one model, one variant per target, each with the proofs that were run, in
ONNX Runtime's model package layout (a folder with ``manifest.json``; ORT 1.32 reads it and picks
the variant that fits each EP device).

    package/
      manifest.json              ORT's manifest; additional_metadata.ortprep: source, reference
      model/component.json       the variants, in the order ORT prefers them
      model/cpu/model.onnx       float: the source model, proven to load on the CPU EP
      model/cuda/model.onnx      FP16 (convert --fp16 --ep cuda, verified)
      model/qnn/model.onnx       EPContext (compile --ep qnn), with QNN's compatibility string
      model/qnn-qdq/model.onnx   its QDQ source (quantize --static --ep qnn), for devices the
                                 compiled binary does not fit

What each target gets (:data:`KIND_BY_EP`): float for the CPU EPs and OpenVINO (which converts
itself), FP16 for the GPU EPs and DirectML's NPU, QDQ (+ EPContext) for QNN. Every variant is
made by ortprep's own steps, so it passes their gates; then ``check`` gives its placement, and
``load`` runs it on the EP where the EP runs here. A target whose variant fails its gate stops
the package: nothing is written. The package is staged beside the destination and renamed into
place.

``load --package`` (:func:`load_package`) asks the installed ORT which variant each available EP
gets, then proves that variant there.

A list of one-target pipelines, like a repository run: this module stands above the pipeline.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.config import StepEntry
from ortprep.errors import EnvironmentMissingError, OrtprepError, UsageError
from ortprep.findings import Finding, Severity
from ortprep.model import file_sha256
from ortprep.report import RunReport
from ortprep.steps import options_class, step_class
from ortprep.version import __version__

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
# it by EP name alone. QNN names none: onnxruntime-qnn 2.7.0 offers its HTP backend on x86-64 Linux
# (the simulator) as an OrtHardwareDeviceType.CPU device, so a variant for "npu" is never selected
# there (measured with onnxruntime 1.32.0, get_ep_devices); the SoC it is for is in its
# compatibility string and its provider options.
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
        targets += [PackageTarget(t.name, t.ep, t.device, t.runtime) for t in parse_repository(raw, text).targets]
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


@dataclass
class PackageReport:
    model: Path
    destination: Path
    variants: list[VariantOutcome] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    ort_check: dict[str, Any] | None = None
    written: bool = False
    findings: list[Finding] = field(default_factory=list)

    def exit_code(self) -> int:
        return 0 if self.written else 1

    def document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": str(self.model),
            "package": str(self.destination) if self.written else None,
            "written": self.written,
            "ort_model_package": self.ort_check,
            "variants": [row for outcome in self.variants for row in _variant_rows(outcome, self.manifest)],
            "findings": [f.to_record() for f in self.findings],
        }


# --- building ------------------------------------------------------------------------------------


def _step(name: str, values: dict[str, Any], output: Path | None, label: str) -> StepEntry:
    options = options_class(name).from_values(values, where=f"package: {label}")
    return StepEntry(step_class(name)(options), Severity.ERROR, output, label)


def _proof_steps(target: PackageTarget, options: PackageOptions, reference: Path, runs_here: bool) -> list[StepEntry]:
    """check (placement) and, where the EP runs here, load (the real session, against the float model)."""
    check = {"eps": [target.ep], **({"device": target.device} if target.device else {})}
    steps = [_step("check", check, None, f"{target.name}: check")]
    if runs_here:
        load = {"eps": [target.ep], "reference": str(reference), "timeout": options.timeout,
                **({"device": target.device} if target.device else {}),
                **({"inputs": str(options.inputs)} if options.inputs else {}),
                **({"shapes": options.shapes} if options.shapes else {}),
                **({"runtimes": {target.ep: str(target.runtime)}} if target.runtime else {})}
        steps.append(_step("load", load, None, f"{target.name}: load"))
    return steps


def _transform_steps(target: PackageTarget, kind: str, options: PackageOptions, variant_dir: Path) -> list[StepEntry]:
    verify = {**({"inputs": str(options.inputs)} if options.inputs else {}),
              **({"shapes": options.shapes} if options.shapes else {}),
              **({"metrics": options.metrics} if options.metrics else {})}
    if kind == "fp16":
        return [_step("convert", {"fp16": True, "ep": target.ep, **verify}, variant_dir / MODEL_FILE,
                      f"{target.name}: convert --fp16")]
    if kind == "qdq":
        values = {"mode": "static", "ep": target.ep, "calib": str(options.calib), "auto_exclude": True,
                  **({"device": target.device} if target.device else {}),
                  **({"metrics": options.metrics} if options.metrics else {}),
                  **({"min_cosine": options.min_cosine} if options.min_cosine is not None else {})}
        return [_step("quantize", values, variant_dir / MODEL_FILE, f"{target.name}: quantize --static")]
    return []


def _available_here(target: PackageTarget) -> bool:
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.targets import ep_runtime

    runtimes = {target.ep: target.runtime} if target.runtime else None
    return ep_runtime(resolve_ep(target.ep), runtimes).available


def _build_variant(model: Path, target: PackageTarget, options: PackageOptions, root: Path, work: Path) -> VariantOutcome:
    from ortprep.model import ModelHandle
    from ortprep.pipeline import Pipeline

    kind = KIND_BY_EP[target.ep]
    outcome = VariantOutcome(target, kind)
    runs_here = _available_here(target)
    name = f"{target.name}-qdq" if kind == "qdq" and options.compile and target.ep in COMPILED else target.name
    variant_dir = root / COMPONENT / name
    variant_dir.mkdir(parents=True)
    source = model
    if kind == "float":
        source = _copy_model(ModelHandle.open(model), variant_dir / MODEL_FILE)
    steps = _transform_steps(target, kind, options, variant_dir) + _proof_steps(target, options, model, runs_here)
    outcome.report = Pipeline(steps=steps, model=source, output_dir=work / target.name).run()
    if outcome.failed:
        return outcome
    outcome.files[name] = variant_dir / MODEL_FILE
    if name != target.name:  # QNN: the EPContext model, for the device named
        compiled = root / COMPONENT / target.name
        compiled.mkdir(parents=True)
        values = {"ep": target.ep, "timeout": options.timeout, **({"device": target.device} if target.device else {}),
                  **({"inputs": str(options.inputs)} if options.inputs else {}),
                  **({"eval": str(options.calib)} if options.calib and options.calib != "random" else {}),
                  **({"shapes": options.shapes} if options.shapes else {})}
        if runs_here:
            outcome.compile_report = Pipeline(steps=[_step("compile", values, compiled / MODEL_FILE,
                                                           f"{target.name}: compile")],
                                              model=variant_dir / MODEL_FILE).run()
            if not any(step.status == "failed" for step in outcome.compile_report.steps):
                outcome.files = {target.name: compiled / MODEL_FILE, **outcome.files}
        if target.name not in outcome.files:
            shutil.rmtree(compiled, ignore_errors=True)
    return outcome


def _copy_model(handle, dest: Path) -> Path:
    """The model's own bytes at ``dest``, its external-data files beside it under the locations
    the model names (validated inside its folder when it was opened): no weight is read into
    memory, and the variant is byte for byte the source."""
    shutil.copyfile(handle.path, dest)
    for entry in handle.external_files:
        target = dest.parent / entry.location
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry.path, target)
    return dest


def build_package(model: Path, destination: Path, options: PackageOptions, *, progress=None) -> PackageReport:
    """Make, prove and write the package; nothing is written when a target fails."""
    from ortprep.model import ModelHandle
    from ortprep.runtime.worker import workers_scope

    model = Path(os.path.abspath(model))
    destination = Path(os.path.abspath(destination))
    _check_request(model, destination, options)
    handle = ModelHandle.open(model)  # a model that cannot be read stops here (exit 2)
    report = PackageReport(model, destination)
    made = next((p for p in reversed(destination.parents) if not p.exists()), None)  # removed again on a refusal
    destination.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".ortprep-tmp", dir=destination.parent))
    work = Path(tempfile.mkdtemp(prefix=".work.", dir=stage))
    try:
        with workers_scope():
            for index, target in enumerate(options.targets):
                if progress is not None:
                    progress("package", index, len(options.targets))
                outcome = _build_variant(model, target, options, stage, work)
                report.variants.append(outcome)
                if outcome.failed:
                    report.findings.append(_refusal(outcome))
                    return report
                report.findings += _variant_notes(outcome, options, destination)
            if progress is not None:
                progress("package", len(options.targets), len(options.targets))
            shutil.rmtree(work)
            report.manifest = _write_manifest(stage, handle, report, options)
            report.ort_check = _ort_reads(stage)
        # renamed once the workers are gone: a session they kept may hold a staged file open
        # (ORT maps external data), and Windows renames no folder with open files
        _move_into_place(stage, destination, options.force)
        report.written = True
        return report
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
        if not report.written and made is not None:
            shutil.rmtree(made, ignore_errors=True)  # the folders made for -o, empty after a refusal


def _variant_notes(outcome: VariantOutcome, options: PackageOptions, destination: Path) -> list[Finding]:
    """What a made variant lacks: its EPContext model (PKG003), a session on its EP (PKG002)."""
    target = outcome.target
    notes = []
    if outcome.compile_report is not None and target.name not in outcome.files:
        notes.append(_compile_fallback(outcome))
    elif target.ep in COMPILED and outcome.compile_report is None:
        why = "--no-compile" if not options.compile else f"{target.ep} does not run here"
        notes.append(Finding.of(
            "PKG003", f"target {target.name}: no EPContext model was compiled ({why}); the package holds the QDQ "
            "model, which the EP compiles each time a session is created",
            ep=target.ep, fix=f"ortprep package where {target.ep} runs, with --compile"))
    if not any(step.run == "load" for step in outcome.report.steps):
        notes.append(Finding.of(
            "PKG002", f"target {target.name}: {target.ep} does not run here; the variant's proofs are its transform's "
            "gate and check's prediction, not a session", ep=target.ep,
            fix=f"ortprep load --package {destination} on a machine with {target.ep}"))
    return notes


def _check_request(model: Path, destination: Path, options: PackageOptions) -> None:
    from ortprep.eps.registry import resolve_ep

    if not options.targets:
        raise UsageError("package: no target given", hint="pass --target EP (repeatable), or --config with [targets]")
    names = [t.name for t in options.targets]
    if len(set(names)) != len(names):
        raise UsageError(f"package: target names repeat: {', '.join(names)}", hint="name each target once")
    folders: list[str] = []
    for target in options.targets:
        target.ep = resolve_ep(target.ep).name
        if target.ep not in KIND_BY_EP:
            raise UsageError(f"package: no variant kind for {target.ep}", hint="targets: " + ", ".join(KIND_BY_EP))
        if not target.name.replace("-", "").replace("_", "").isalnum():
            raise UsageError(f"package: target name {target.name!r} is not a folder name", hint="use letters, digits, - and _")
        if KIND_BY_EP[target.ep] == "qdq" and not options.calib:
            raise UsageError(f"package: target {target.name} ({target.ep}) is quantized and needs calibration data",
                             hint="pass --calib DIR (samples as the application feeds them)")
        folders.append(target.name)
        if KIND_BY_EP[target.ep] == "qdq" and options.compile and target.ep in COMPILED:
            folders.append(f"{target.name}-qdq")
    lowered = [name.lower() for name in folders]  # folders of one name but for case collide on Windows and macOS
    clashing = sorted({name for name in folders if lowered.count(name.lower()) > 1})
    if clashing:
        raise UsageError(f"package: two variants would share the folder {', '.join(clashing)}",
                         hint="name the targets apart (--target NAME=EP); a compiled QNN target also makes NAME-qdq")
    if destination.exists() and not options.force:
        raise UsageError(f"package: {destination} exists", hint="choose another -o, or pass --force to replace it")
    if destination == model or destination in model.parents:
        raise UsageError(f"package: {destination} holds the source model", hint="write the package elsewhere")
    if destination.exists() and not (destination / "manifest.json").is_file():
        raise UsageError(f"package: {destination} is not a package; --force replaces packages only",
                         hint="choose another -o")


def _refusal(outcome: VariantOutcome) -> Finding:
    failed = next(step for step in outcome.report.steps if step.status == "failed")
    errors = [f for f in (failed.result.findings if failed.result else []) if f.severity >= Severity.ERROR]
    cause = errors[0].message if errors else "the step failed"
    return Finding.of("PKG001", f"target {outcome.target.name}: {failed.label.split(': ', 1)[-1]} failed ({cause}); "
                      "the package is not written", ep=outcome.target.ep,
                      fix=(errors[0].fix if errors and errors[0].fix else None) or "fix that target, or leave it out")


def _compile_fallback(outcome: VariantOutcome) -> Finding:
    step = outcome.compile_report.steps[0]
    errors = [f for f in (step.result.findings if step.result else []) if f.severity >= Severity.ERROR]
    cause = errors[0].message if errors else "it failed"
    return Finding.of("PKG003", f"target {outcome.target.name}: compiling the EPContext model failed ({cause}); the "
                      "package holds the QDQ model, which the EP compiles when a session is created",
                      ep=outcome.target.ep, fix="ortprep compile the qdq variant to see the EP's words")


def _compatibility(path: Path, provider: str) -> str | None:
    """The compatibility string a compiled model carries for its EP (ORT writes it into the
    model's metadata as ep_compatibility_info.<EP>)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in proto.metadata_props if p.key == f"ep_compatibility_info.{provider}"), None)


def _write_manifest(root: Path, handle, report: PackageReport, options: PackageOptions) -> dict[str, Any]:
    from ortprep.eps.registry import resolve_ep

    variants: dict[str, Any] = {}
    reference = None
    for outcome in report.variants:
        provider = resolve_ep(outcome.target.ep).provider
        for name, path in outcome.files.items():
            compiled = outcome.compile_report is not None and name == outcome.target.name and outcome.kind == "qdq"
            kind = "epcontext" if compiled else outcome.kind
            if kind == "float" and reference is None:
                reference = name
            body: dict[str, Any] = {"ep": provider}
            if DEVICE_BY_EP.get(outcome.target.ep):
                body["device"] = DEVICE_BY_EP[outcome.target.ep]
            if compiled and (compatibility := _compatibility(path, provider)):
                body["compatibility_string"] = compatibility
            provider_options = _provider_options(outcome)
            body["executor_info"] = {"ort": {"model_file": MODEL_FILE,
                                             **({"provider_options": provider_options} if provider_options else {})}}
            body["additional_metadata"] = {"ortprep": {
                "target": outcome.target.name, "ep": outcome.target.ep, "kind": kind,
                "sha256": file_sha256(path), "files": _digests(path),
                "bytes": sum(p.stat().st_size for p in path.parent.iterdir() if p.is_file()),
                "proofs": _proofs(outcome, compiled)}}
            variants[name] = body
    component = {"component_name": COMPONENT, "variants": variants}
    manifest = {"schema_version": "1.0", "package_name": options.name or handle.path.stem,
                **({"package_version": options.version} if options.version else {}),
                "description": f"{handle.path.name}: one variant per target, made and proven by ortprep",
                "components": {COMPONENT: COMPONENT},
                "additional_metadata": {"ortprep": {"schema": SCHEMA, "ortprep_version": __version__,
                                                    "source": {"file": handle.path.name, "sha256": file_sha256(handle.path),
                                                               "files": handle.sha256(include_data=True)},
                                                    "reference_variant": reference}}}
    (root / COMPONENT / "component.json").write_text(json.dumps(component, indent=2) + "\n", encoding="utf-8")
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return {"manifest": manifest, "component": component}


def _provider_options(outcome: VariantOutcome) -> dict[str, str]:
    """The EP options the proofs ran with (QNN: its soc_model), for the application's session;
    local paths (a backend library) are left to the machine. Where no session ran here, the
    options of the device the variant was made for."""
    for step in outcome.report.steps if outcome.report else []:
        data = step.result.data if step.result else {}
        for row in data.get("results", []) if step.run == "load" else []:
            if row.get("provider_options"):
                return {k: str(v) for k, v in row["provider_options"].items() if "path" not in k}
    from ortprep.eps.devices import has_devices, resolve_device

    if has_devices(outcome.target.ep):
        return {k: str(v) for k, v in resolve_device(outcome.target.ep, outcome.target.device).provider_options.items()}
    return {}


def _digests(model: Path) -> dict[str, str]:
    """sha256 of the variant's model file and of each external-data file it reads."""
    from ortprep.model import ModelHandle

    return ModelHandle.open(model).sha256(include_data=True)


def _step_data(report: RunReport | None, name: str) -> dict[str, Any] | None:
    for step in report.steps if report else []:
        if step.run == name and step.result is not None:
            return step.result.data
    return None


def _proofs(outcome: VariantOutcome, compiled: bool) -> dict[str, Any]:
    proofs: dict[str, Any] = {}
    check = _step_data(outcome.report, "check")
    if check and check.get("results"):
        row = check["results"][0]
        proofs["placement"] = {"verdict": row.get("verdict"), "node_share": row.get("node_share"),
                               "partitions": row.get("partitions"), "fallback_nodes": len(row.get("fallback_nodes") or []),
                               "by": "check (prediction from the EP's tables)"}
    for name in ("convert", "quantize"):
        data = _step_data(outcome.report, name)
        if data and data.get("verify"):
            verify = data["verify"]
            proofs["accuracy"] = {"step": name, "cosine": verify.get("cosine"), "passed": verify.get("passed", True),
                                  "samples": data.get("evaluation_samples"),
                                  "inputs": data.get("inputs") or data.get("evaluation_inputs"),
                                  "decisions": [{"output": d.get("name"), "kind": d.get("kind"),
                                                 "agreement": d.get("agreement"), "passed": d.get("passed"),
                                                 **({"ranking": d["ranking"]} if d.get("ranking") else {}),
                                                 **({"confidence": d["confidence"]} if d.get("confidence") else {})}
                                                for d in verify.get("decisions") or []]}
    load = _step_data(outcome.report, "load")
    if load and load.get("results"):
        row = load["results"][0]
        three = row.get("three_way") or {}
        proofs["load"] = {"ep": row.get("ep"), "status": row.get("status"), "nodes_on_ep": row.get("nodes_on_ep"),
                          "nodes_total": row.get("nodes_total"), "latency_ms": row.get("latency_ms"),
                          "vs_float": three.get("total"), "vs_cpu": three.get("ep")}
    else:
        proofs["load"] = {"status": "not run", "why": f"{outcome.target.ep} does not run on the machine that made the package"}
    if compiled:  # the EPContext model: compile reloaded it on the EP and compared it with its QDQ source
        data = _step_data(outcome.compile_report, "compile") or {}
        proofs["placement"] = {"ep_context_nodes": data.get("ep_context_nodes"), "other_nodes": data.get("other_nodes"),
                               "by": "compile (the compiled model as reloaded)"}
        proofs["load"] = {"ep": outcome.target.ep, "status": "ok" if not data.get("error") else "failed",
                          "by": "compile (reloaded on the EP and run)",
                          "vs_source": [{k: row.get(k) for k in ("name", "cosine", "norm_ratio", "max_abs_diff")}
                                        for row in data.get("outputs") or []]}
        proofs["compile"] = {"compatibility": data.get("compatibility"), "device": (data.get("device") or {}).get("name"),
                             "samples": {k: v for k, v in (data.get("eval") or {}).items() if k != "worst"} or None}
    return proofs


def _variant_rows(outcome: VariantOutcome, manifest: dict[str, Any] | None) -> list[dict[str, Any]]:
    variants = (manifest or {}).get("component", {}).get("variants", {})
    rows = []
    names = list(outcome.files) or [outcome.target.name]
    for name in names:
        body = variants.get(name, {})
        meta = body.get("additional_metadata", {}).get("ortprep", {})
        rows.append({"name": name, "target": outcome.target.name, "ep": outcome.target.ep,
                     "kind": meta.get("kind", outcome.kind), "status": "failed" if outcome.failed else "ok",
                     "file": f"{COMPONENT}/{name}/{MODEL_FILE}" if name in outcome.files else None,
                     "device": body.get("device"), "compatibility_string": body.get("compatibility_string"),
                     "bytes": meta.get("bytes"), "sha256": meta.get("sha256"),
                     "proofs": meta.get("proofs") or _proofs(outcome, False),
                     "steps": [{"step": s.label, "status": s.status} for s in (outcome.report.steps if outcome.report else [])]})
    return rows


def _ort_reads(root: Path) -> dict[str, Any]:
    """Proof that the installed ORT reads the package, with its own (strict) reader."""
    from ortprep.runtime.requests.package import OpenPackage
    from ortprep.runtime.worker import call

    reply = call(OpenPackage(package=str(root)), timeout=120)
    if not reply.ok:
        raise OrtprepError(f"package: onnxruntime refuses the package ortprep wrote: {reply.message}",
                           hint="this is a bug in ortprep; please report it with the command line")
    if not reply.api:
        return {"read_by": None, "onnxruntime": reply.version,
                "why": "this onnxruntime has no model package API (1.32 and later read the layout)"}
    return {"read_by": f"onnxruntime {reply.version}", **reply.info}


def _move_into_place(stage: Path, destination: Path, force: bool) -> None:
    if destination.exists() and force:
        old = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old.", suffix=".ortprep-tmp", dir=destination.parent))
        os.replace(destination, old / destination.name)
        os.replace(stage, destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(stage, destination)


# --- loading -------------------------------------------------------------------------------------


@dataclass
class PackageLoad:
    package: Path
    selections: list[dict[str, Any]] = field(default_factory=list)
    reports: list[RunReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def exit_code(self) -> int:
        failed = any(f.severity >= Severity.ERROR for f in self.findings) or any(r.exit_code() for r in self.reports)
        if failed:
            return 1
        return 3 if any(f.code == "PKG004" for f in self.findings) else 0  # an EP asked for is missing, as load says

    def document(self) -> dict[str, Any]:
        results = []
        for selection in self.selections:
            report = selection.get("_report")
            row = {k: v for k, v in selection.items() if not k.startswith("_")}
            if report is not None:
                data = _step_data(report, "load") or {}
                row["load"] = (data.get("results") or [None])[0]
                row["status"] = "failed" if report.exit_code() else "passed"
                row["findings"] = [f.to_record() for s in report.steps if s.result for f in s.result.findings]
            results.append(row)
        return {"schema": LOAD_SCHEMA, "package": str(self.package), "results": results,
                "findings": [f.to_record() for f in self.findings]}


def read_package(package: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The manifest and the variants of its component (declaration order); one clear error for
    a folder that is not a package."""
    manifest_path = package / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError(f"{package} is not a model package (no manifest.json)", hint="make one with: ortprep package MODEL -o DIR")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        value = manifest["components"][COMPONENT]
        if isinstance(value, str):
            path = _inside(package, value)
            value = json.loads(((path / "component.json") if path.is_dir() else path).read_text(encoding="utf-8"))
        return manifest, dict(value["variants"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{package}: cannot read the package's manifest ({exc})",
                         hint="a package ortprep wrote has components.model with its variants") from None


def _inside(package: Path, relative: str) -> Path:
    path = (package / relative).resolve()
    if package.resolve() not in path.parents and path != package.resolve():
        raise UsageError(f"{package}: the manifest points outside the package ({relative})", hint="portable packages stay inside their folder")
    return path


def variant_file(package: Path, name: str, body: dict[str, Any]) -> Path:
    ort_info = (body.get("executor_info") or {}).get("ort") or {}
    if isinstance(ort_info, str):
        ort_info = json.loads(_inside(package / COMPONENT / body.get("variant_directory", name), ort_info).read_text())
    folder = _inside(package / COMPONENT, body.get("variant_directory", name))
    return _inside(folder, ort_info.get("model_file", MODEL_FILE))


def load_package(package: Path, load_values: dict[str, Any]) -> PackageLoad:
    """For each EP (given, or every one available here), the variant the installed ORT picks for
    it, then ``load`` of that variant on that EP against the package's float variant.
    ``load_values``: load's options as given (command-line strings or config values)."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.pipeline import Pipeline
    from ortprep.runtime.requests.package import SelectVariant
    from ortprep.runtime.targets import ep_runtime, session_options
    from ortprep.runtime.worker import call, workers_scope

    package = Path(os.path.abspath(package))
    manifest, variants = read_package(package)
    meta = (manifest.get("additional_metadata") or {}).get("ortprep") or {}
    reference_name = meta.get("reference_variant")
    reference = variant_file(package, reference_name, variants[reference_name]) if reference_name in variants else None
    result = PackageLoad(package)
    parsed = options_class("load").from_values(load_values, where="load --package")
    with workers_scope():
        eps = parsed.eps or _available_eps(variants, parsed.runtimes)
        if not eps:
            kinds = sorted({body.get("ep", "?") for body in variants.values()})
            raise EnvironmentMissingError(f"load --package: no EP a variant of {package.name} is for runs here "
                                          f"({', '.join(kinds)})", hint="ortprep doctor lists the EPs this machine runs")
        for label in eps:
            spec = resolve_ep(label)
            target = ep_runtime(spec, parsed.runtimes)
            if not target.available:
                result.findings.append(Finding.of("PKG004", f"{spec.name} does not run here: no variant was tried on it",
                                                  ep=spec.name, fix=f"{spec.install_hint}; ortprep doctor"))
                continue
            options = session_options(target, parsed.provider_options, parsed.device)
            request = SelectVariant(package=str(package), component=COMPONENT, provider=spec.provider,
                                    plugin_library=(target.plugin or {}).get("library"),
                                    device_metadata=(target.plugin or {}).get("device_metadata") or {},
                                    provider_options=options, variants=variants)
            reply = call(request, python=target.python, timeout=120)
            if reply.status == "crashed":  # ORT's selection died (seen: SIGSEGV with the QNN plugin, 1.32.0)
                crash = f"onnxruntime's selection crashed ({reply.died})"
                request.ask_ort = False
                reply = call(request, python=target.python, timeout=120)
                if reply.ok:
                    reply.why = f"{crash}; {reply.why}"
            selection: dict[str, Any] = {"ep": spec.name, "variant": reply.variant if reply.ok else None,
                                         "selected_by": reply.selected_by if reply.ok else None,
                                         "why": reply.why if reply.ok else reply.message}
            result.selections.append(selection)
            if not reply.ok or reply.variant is None:
                result.findings.append(Finding.of("PKG005", f"no variant of {package.name} fits {spec.name} here: "
                                                  f"{selection['why']}", ep=spec.name,
                                                  fix=f"add a target for {spec.name}: ortprep package MODEL --target {spec.name}"))
                continue
            body = variants[reply.variant]
            path = variant_file(package, reply.variant, body)
            selection["file"] = path.relative_to(package).as_posix()
            selection["compatibility_string"] = body.get("compatibility_string")
            ort_info = (body.get("executor_info") or {}).get("ort") or {}
            values = {**load_values, "eps": [spec.name]}
            if reference is not None and reference != path:
                values["reference"] = str(reference)
            # the variant's options first (what its proofs ran with), the user's after them (they win)
            given = [f"{spec.name}:{key}={value}" for key, value in (ort_info.get("provider_options") or {}).items()]
            user = load_values.get("provider_options") or []
            user = [f"{ep}:{key}={value}" for ep, pairs in user.items() for key, value in pairs.items()] \
                if isinstance(user, dict) else list(user)
            if given or user:
                values["provider_options"] = given + user
            options_obj = options_class("load").from_values(values, where="load --package")
            report = Pipeline.single("load", options_obj, path).run()
            selection["_report"] = report
            result.reports.append(report)
    return result


def _available_eps(variants: dict[str, dict[str, Any]], runtimes: dict[str, Any] | None = None) -> list[str]:
    """Every EP a variant is for that runs here (one per provider, the device kind deciding
    between DirectML's GPU and NPU)."""
    from ortprep.eps.registry import EPS
    from ortprep.runtime.targets import ep_runtime

    wanted = []
    for body in variants.values():
        for spec in EPS:
            if spec.provider == body.get("ep") and DEVICE_BY_EP.get(spec.name) in (body.get("device"), None) \
                    and spec.name not in wanted:
                wanted.append(spec.name)
                break
    return [name for name in wanted if ep_runtime(next(s for s in EPS if s.name == name), runtimes).available]
