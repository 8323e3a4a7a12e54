"""Model packages in a worker: does this ONNX Runtime read ortprep's package (its model package
API, where the release has one), and which variant does it pick for one EP.

ORT 1.32 added model packages: a folder with ``manifest.json``, components and variants, each
variant bound to an EP, a device kind (cpu/gpu/npu) and optionally a compiled model's
compatibility string, which the EP itself validates (onnxruntime source,
``onnxruntime/core/session/model_package/README.md``: the first EP of the session options is
matched by name and device, then scored by ``ValidateCompiledModelCompatibilityInfo``; a variant
the EP calls unsupported is rejected; declaration order breaks ties). Where the release has no
such API, or the EP offers no device to select with (EPs registered by name, not through
devices), ortprep applies the same rules itself and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState

# device kinds of a variant -> ORT's OrtHardwareDeviceType names
DEVICE_TYPES = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}


@dataclass
class OpenPackageReply(Reply):
    api: bool = False  # the release has ORT's model package API
    version: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # components -> variant names, schema


@dataclass
class OpenPackage(Request):
    """Open a package folder with ORT's own reader (strict about unknown fields): proof that the
    installed release reads what ortprep wrote."""

    reply_type = OpenPackageReply
    package: str = ""

    def handle(self, state: WorkerState) -> OpenPackageReply:
        ort = state.ort
        if not hasattr(ort, "ModelPackageContext"):
            return OpenPackageReply(api=False, version=ort.__version__)
        context = ort.ModelPackageContext(self.package)
        info = {"schema_version": context.get_schema_version(),
                "components": {name: context.get_variant_names(name) for name in context.get_component_names()}}
        return OpenPackageReply(api=True, version=ort.__version__, info=info)


@dataclass
class SelectVariantReply(Reply):
    variant: str | None = None
    selected_by: str = ""  # "onnxruntime" (its model package API) or "ortprep" (the same rules, applied here)
    why: str = ""
    version: str = ""


@dataclass
class SelectVariant(Request):
    """Which variant of ``component`` a session for ``provider`` gets. ``variants``: the
    component's variant bodies in declaration order (for the fallback selection)."""

    reply_type = SelectVariantReply
    package: str = ""
    component: str = ""
    provider: str = ""
    plugin_library: str | None = None
    device_metadata: dict[str, str] = field(default_factory=dict)
    provider_options: dict[str, str] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    ask_ort: bool = True  # False: ORT's rules applied by ortprep (after ORT's own selection crashed)

    def affinity(self):
        return ("package", self.provider, self.ask_ort, tuple(sorted(self.provider_options.items())))

    def _devices(self, state: WorkerState) -> list:
        if self.plugin_library:
            state.register_plugin(self.provider, self.plugin_library)
        return [d for d in state.ort.get_ep_devices() if d.ep_name == self.provider
                and all(d.ep_metadata.get(k) == v for k, v in self.device_metadata.items())]

    def handle(self, state: WorkerState) -> SelectVariantReply:
        ort = state.ort
        devices = self._devices(state) if hasattr(ort, "get_ep_devices") else []
        if self.ask_ort and hasattr(ort, "ModelPackageContext") and devices:
            # The selected component refers to the package context and the options it was chosen
            # with: all of them are kept until the name is read, and released newest first (a
            # temporary ModelPackageOptions crashed the worker now and then, SIGSEGV, 1.32.0).
            options = ort.SessionOptions()
            options.add_provider_for_devices(devices, dict(self.provider_options))
            package_options = ort.ModelPackageOptions(options)
            context = ort.ModelPackageContext(self.package)
            try:
                chosen = context.select_component(self.component, package_options)
            except Exception as exc:  # ORT's words: no variant fits this EP
                return SelectVariantReply(variant=None, selected_by="onnxruntime", why=str(exc).strip(),
                                          version=ort.__version__)
            name = chosen.get_selected_variant_name()
            del chosen, context, package_options, options
            return SelectVariantReply(variant=name, selected_by="onnxruntime",
                                      why=f"onnxruntime {ort.__version__} model package selection for {self.provider}",
                                      version=ort.__version__)
        return self._fallback(ort, devices)

    def _fallback(self, ort, devices) -> SelectVariantReply:
        """ORT's rules where its API cannot be asked: EP name, device kind, compatibility."""
        kinds = {str(d.device.type).rsplit(".", 1)[-1] for d in devices}
        why = ("this onnxruntime has no model package API" if not hasattr(ort, "ModelPackageContext")
               else f"{self.provider} offers no EP device to select with" if not devices
               else "onnxruntime's own selection crashed")
        best: tuple[int, str] | None = None
        notes = []
        for name, body in self.variants.items():
            if body.get("ep") != self.provider:
                continue
            device = body.get("device")
            if device and kinds and DEVICE_TYPES.get(device) not in kinds:
                notes.append(f"{name}: device {device} not offered")
                continue
            score = 0
            compatibility = body.get("compatibility_string")
            if compatibility:
                validate = getattr(ort.capi._pybind_state, "get_model_compatibility_for_ep_devices", None)
                if not devices or validate is None:
                    notes.append(f"{name}: its compiled model's compatibility cannot be checked here")
                    continue
                try:
                    verdict = str(validate(devices, compatibility)).rsplit(".", 1)[-1]
                except Exception as exc:  # noqa: BLE001 - the EP cannot judge it on this device
                    # as ORT's own selection scores it: not applicable (0), the variant stays a
                    # candidate. Seen: onnxruntime-qnn 2.7.0 validates on NPU devices only, and its
                    # simulator offers a CPU device.
                    notes.append(f"{name}: the EP could not judge its compiled model here ({str(exc).strip()[:160]})")
                    verdict = "EP_NOT_APPLICABLE"
                if verdict == "EP_UNSUPPORTED":
                    notes.append(f"{name}: the EP says its compiled model does not fit")
                    continue
                score = {"EP_SUPPORTED_OPTIMAL": 100, "EP_SUPPORTED_PREFER_RECOMPILATION": 50}.get(verdict, 0)
            if best is None or score > best[0]:
                best = (score, name)
        if best is None:
            return SelectVariantReply(
                variant=None,
                selected_by="ortprep",
                why=f"no variant for {self.provider} ({why})" + (": " + "; ".join(notes) if notes else ""),
                version=ort.__version__,
            )
        return SelectVariantReply(variant=best[1], selected_by="ortprep",
                                  why=f"ORT's selection rules applied by ortprep ({why})"
                                  + ("; " + "; ".join(notes) if notes else ""), version=ort.__version__)

