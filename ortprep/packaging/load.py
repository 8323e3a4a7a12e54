"""``load --package``: the variant the installed ORT picks for each EP here, then that variant
proven on that EP against the package's float variant."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.errors import EnvironmentMissingError, UsageError
from ortprep.findings import Finding, Severity
from ortprep.packaging.manifest import step_data
from ortprep.packaging.targets import COMPONENT, DEVICE_BY_EP, LOAD_SCHEMA, MODEL_FILE
from ortprep.report import RunReport
from ortprep.steps import options_class


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
                data = step_data(report, "load") or {}
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
        raise UsageError(f"{package} is not a model package (no manifest.json)",
                         hint="make one with: ortprep package MODEL -o DIR")
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
        raise UsageError(f"{package}: the manifest points outside the package ({relative})",
                         hint="portable packages stay inside their folder")
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
                                          f"({', '.join(kinds)})",
                                          hint="ortprep doctor lists the EPs this machine runs")
        for label in eps:
            spec = resolve_ep(label)
            target = ep_runtime(spec, parsed.runtimes)
            if not target.available:
                result.findings.append(Finding.of("PKG004",
                                                  f"{spec.name} does not run here: no variant was tried on it",
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
                                                  fix=f"add a target for {spec.name}: ortprep package MODEL --target "
                                                      f"{spec.name}"))
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
