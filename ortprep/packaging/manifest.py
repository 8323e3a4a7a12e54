"""The package's manifest (ORT's layout) and each variant's proofs, read back from the reports
of the steps that made and proved it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError
from ortprep.model import file_sha256
from ortprep.packaging.targets import COMPONENT, DEVICE_BY_EP, MODEL_FILE, SCHEMA, PackageOptions, VariantOutcome
from ortprep.report import RunReport
from ortprep.version import __version__


def _compatibility(path: Path, provider: str) -> str | None:
    """The compatibility string a compiled model carries for its EP (ORT writes it into the
    model's metadata as ep_compatibility_info.<EP>)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in proto.metadata_props if p.key == f"ep_compatibility_info.{provider}"), None)


def write_manifest(root: Path, handle, outcomes: list[VariantOutcome], options: PackageOptions) -> dict[str, Any]:
    from ortprep.eps.registry import resolve_ep

    variants: dict[str, Any] = {}
    reference = None
    for outcome in outcomes:
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
                                                    "source": {"file": handle.path.name,
                                                               "sha256": file_sha256(handle.path),
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


def step_data(report: RunReport | None, name: str) -> dict[str, Any] | None:
    for step in report.steps if report else []:
        if step.run == name and step.result is not None:
            return step.result.data
    return None


def _proofs(outcome: VariantOutcome, compiled: bool) -> dict[str, Any]:
    proofs: dict[str, Any] = {}
    check = step_data(outcome.report, "check")
    if check and check.get("results"):
        row = check["results"][0]
        proofs["placement"] = {"verdict": row.get("verdict"), "node_share": row.get("node_share"),
                               "partitions": row.get("partitions"),
                               "fallback_nodes": len(row.get("fallback_nodes") or []),
                               "by": "check (prediction from the EP's tables)"}
    for name in ("convert", "quantize"):
        data = step_data(outcome.report, name)
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
    load = step_data(outcome.report, "load")
    if load and load.get("results"):
        row = load["results"][0]
        three = row.get("three_way") or {}
        proofs["load"] = {"ep": row.get("ep"), "status": row.get("status"), "nodes_on_ep": row.get("nodes_on_ep"),
                          "nodes_total": row.get("nodes_total"), "latency_ms": row.get("latency_ms"),
                          "vs_float": three.get("total"), "vs_cpu": three.get("ep")}
    else:
        proofs["load"] = {"status": "not run",
                          "why": f"{outcome.target.ep} does not run on the machine that made the package"}
    if compiled:  # the EPContext model: compile reloaded it on the EP and compared it with its QDQ source
        data = step_data(outcome.compile_report, "compile") or {}
        proofs["placement"] = {"ep_context_nodes": data.get("ep_context_nodes"), "other_nodes": data.get("other_nodes"),
                               "by": "compile (the compiled model as reloaded)"}
        proofs["load"] = {"ep": outcome.target.ep, "status": "ok" if not data.get("error") else "failed",
                          "by": "compile (reloaded on the EP and run)",
                          "vs_source": [{k: row.get(k) for k in ("name", "cosine", "norm_ratio", "max_abs_diff")}
                                        for row in data.get("outputs") or []]}
        proofs["compile"] = {"compatibility": data.get("compatibility"),
                             "device": (data.get("device") or {}).get("name"),
                             "samples": {k: v for k, v in (data.get("eval") or {}).items() if k != "worst"} or None}
    return proofs


def variant_rows(outcome: VariantOutcome, manifest: dict[str, Any] | None) -> list[dict[str, Any]]:
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
                     "steps": [{"step": s.label, "status": s.status}
                               for s in (outcome.report.steps if outcome.report else [])]})
    return rows


def ort_reads(root: Path) -> dict[str, Any]:
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
