"""Building a package: each target's variant made by ortprep's own steps and proven, staged
beside the destination and renamed into place; nothing is written when a target fails."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.config import StepEntry
from ortprep.errors import UsageError
from ortprep.findings import Finding, Severity
from ortprep.packaging.manifest import ort_reads, variant_rows, write_manifest
from ortprep.packaging.targets import (
    COMPILED,
    COMPONENT,
    KIND_BY_EP,
    MODEL_FILE,
    SCHEMA,
    PackageOptions,
    PackageTarget,
    VariantOutcome,
)
from ortprep.steps import options_class, step_class


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
            "variants": [row for outcome in self.variants for row in variant_rows(outcome, self.manifest)],
            "findings": [f.to_record() for f in self.findings],
        }


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


def _build_variant(model: Path, target: PackageTarget, options: PackageOptions, root: Path,
                   work: Path) -> VariantOutcome:
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
            report.manifest = write_manifest(stage, handle, report.variants, options)
            report.ort_check = ort_reads(stage)
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
            raise UsageError(f"package: target name {target.name!r} is not a folder name",
                             hint="use letters, digits, - and _")
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


def _move_into_place(stage: Path, destination: Path, force: bool) -> None:
    if destination.exists() and force:
        old = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old.", suffix=".ortprep-tmp", dir=destination.parent))
        os.replace(destination, old / destination.name)
        os.replace(stage, destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(stage, destination)
