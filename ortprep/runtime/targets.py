"""Where an EP runs for ortprep: which interpreter (this one, or another environment's Python
holding another ONNX Runtime flavour), whether it is built in or a plugin EP with a device, and
the provider options its sessions get (ortprep's defaults for the EP, then the user's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortprep.eps.devices import Device, has_devices, resolve_device
from ortprep.eps.registry import EpSpec
from ortprep.runtime.providers import RuntimeProbe, plugin_table, probe_runtime


def simulated(ep: str) -> str | None:
    """Why this EP's time here is not the device's, or None where it is: QNN's HTP backend on an
    x86 machine is a simulator (its time says nothing of a Snapdragon's; one run of the NPU
    journey's layout detector took about 40 s there)."""
    import platform

    if ep == "qnn" and platform.machine().lower() in ("x86_64", "amd64", "x86", "i686"):
        return "QNN's HTP on an x86 machine is a simulator, whose time says nothing of the device's"
    return None


@dataclass
class EpRuntime:
    """Where one EP of a load runs: which interpreter (None: this one), which provider, plugin."""

    spec: EpSpec
    python: str | None
    probe: RuntimeProbe
    plugin: dict[str, Any] | None  # {"library", "device_metadata"} for plugin EPs

    @property
    def available(self) -> bool:
        return self.probe.ok and self.probe.runs(self.spec.name)


def ep_runtime(spec: EpSpec, runtimes: dict[str, Any] | None = None) -> EpRuntime:
    """The environment that runs ``spec``: the one ``runtimes`` names for it (--runtime EP=PYTHON),
    else this one; with the plugin library and device that run it there, if it is a plugin EP."""
    python = (runtimes or {}).get(spec.name)
    probe = probe_runtime(str(python) if python else None)
    plugin = None
    if probe.ok and spec.provider not in probe.providers and probe.devices_for(spec.name):
        found = probe.plugin_for(spec.provider)
        entry = next(e for e in plugin_table() if e["provider"] == spec.provider)
        defaults = {key: (found.get("paths", {}).get(value[1:], value) if value.startswith("@") else value)
                    for key, value in entry["eps"][spec.name]["options"].items()}
        plugin = {"library": found["library"], "device_metadata": entry["eps"][spec.name]["device_metadata"],
                  "options": defaults, "package": f"{entry['distribution']} {found.get('version') or ''}".strip()}
    return EpRuntime(spec, str(python) if python else None, probe, plugin)


def user_options(target: EpRuntime, provider_options: dict[str, dict[str, str]] | None) -> dict[str, str]:
    """The options the user gave for this target's EP (--provider-option EP:KEY=VALUE)."""
    merged: dict[str, str] = {}
    for name, values in (provider_options or {}).items():  # keys are canonical EP names (see Kind.PROVIDER_OPTIONS)
        if name == target.spec.name:
            merged.update(values)
    return merged


def target_device(target: EpRuntime, provider_options: dict[str, dict[str, str]] | None = None,
                  device: str | None = None) -> Device | None:
    """The device this target's sessions are for (QNN: the SoC): --device, else a soc_model the
    user's provider options set, else the EP's stated default; None for EPs without devices."""
    if not has_devices(target.spec.name):
        return None  # --device was validated against the command's EPs; it names none of this one's
    return resolve_device(target.spec.name, device, user_options(target, provider_options))


def session_options(target: EpRuntime, provider_options: dict[str, dict[str, str]] | None = None,
                    device: str | None = None) -> dict[str, str]:
    """The EP's options: its defaults (QNN's HTP backend, OpenVINO's device), the device's (QNN's
    soc_model: --device or the stated default), then the user's (``provider_options``: canonical
    EP name -> {key: value}, as --provider-option gives them)."""
    merged: dict[str, str] = dict(target.spec.session_options)
    if target.plugin:
        merged = {**target.plugin["options"]}
    chosen = target_device(target, provider_options, device)
    if chosen is not None:
        merged.update(chosen.provider_options)
    merged.update(user_options(target, provider_options))
    return merged
