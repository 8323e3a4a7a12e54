"""The device an EP's session is for: for QNN, the Snapdragon SoC (``soc_model``, ``htp_arch``).

A QNN session's outcome depends on the SoC it is built for (measured on the HTP simulator: the
simulator's own default refuses float patterns that today's devices finalize), so a proof holds
for one device and the device is part of the target. ``--device`` names it (a SoC name, an alias
such as ``sm8650``, or ``soc_model=N``); without it ortprep uses a stated modern default and says
so in the report. The table lives in ``data/devices.json``, each entry with its source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from ortprep.errors import UsageError


@dataclass(frozen=True)
class Device:
    """One device of an EP: the provider options that name it to the EP."""

    ep: str
    name: str  # the table's name, or "soc_model=N" for a number the table does not know
    title: str
    provider_options: dict[str, str]
    given: str  # how it was chosen: "default", "--device", or "provider option"
    source: str
    htp_arch: int | None = None  # QNN: the device's HTP architecture (informative; soc_model implies it)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "provider_options": dict(self.provider_options),
            **({"htp_arch": self.htp_arch} if self.htp_arch else {}),
            "chosen_by": self.given,
            "source": self.source,
        }


@lru_cache(maxsize=1)
def device_facts() -> dict[str, Any]:
    return json.loads(resources.files("ortprep.eps").joinpath("data/devices.json").read_text(encoding="utf-8"))


def has_devices(ep: str) -> bool:
    return ep in device_facts() and ep != "sources"


def device_names(ep: str) -> list[str]:
    return list(device_facts()[ep]["devices"]) if has_devices(ep) else []


def _entry(ep: str, name: str, given: str) -> Device:
    facts = device_facts()
    entry = facts[ep]["devices"][name]
    options = {key: str(entry[key]) for key in facts[ep]["option_keys"] if key in entry}
    return Device(ep, name, entry["title"], options, given, facts["sources"].get(entry["source"], entry["source"]),
                  entry.get("htp_arch"))


def resolve_device(ep: str, text: str | None, provider_options: dict[str, str] | None = None) -> Device | None:
    """The device a session of ``ep`` is for: ``text`` (--device), else one the user's provider
    options already name (soc_model=N), else the EP's stated default. None for EPs without a device
    table. A name nobody knows is a UsageError that lists the known ones."""
    if not has_devices(ep):
        if text:
            raise UsageError(f"--device names a device of {', '.join(k for k in device_facts() if k != 'sources')}, "
                             f"not of {ep}", hint="OpenVINO's device is in the EP name: openvino-cpu, openvino-gpu, "
                             "openvino-npu")
        return None
    facts = device_facts()[ep]
    by_soc = {str(entry["soc_model"]): name for name, entry in facts["devices"].items()}
    if text:
        key = text.strip().lower().replace("_", "-").replace(" ", "-")
        for name, entry in facts["devices"].items():  # names first: "888" is a name, not soc_model 888
            if key == name or key in entry.get("aliases", ()):
                return _entry(ep, name, "--device")
        if key.startswith("soc-model=") or key.isdigit():
            number = key.split("=", 1)[-1]
            if not number.isdigit():
                raise UsageError(f"--device {text}: soc_model must be a number", hint="e.g. --device soc_model=60")
            if number in by_soc:
                return _entry(ep, by_soc[number], "--device")
            return Device(ep, f"soc_model={number}", f"SoC model {number} (not in ortprep's table)",
                          {"soc_model": number}, "--device", "given by the user")
        raise UsageError(f"unknown {ep} device '{text}'",
                         hint=f"known: {', '.join(device_names(ep))} (or soc_model=N); "
                              "ortprep check --list-eps lists them with their SoC numbers")
    named = (provider_options or {}).get("soc_model")
    if named is not None:
        if str(named) in by_soc:
            found = _entry(ep, by_soc[str(named)], "provider option")
            return Device(ep, found.name, found.title, {"soc_model": str(named)}, "provider option", found.source,
                          found.htp_arch)
        return Device(
            ep,
            f"soc_model={named}",
            f"SoC model {named} (not in ortprep's table)",
            {"soc_model": str(named)},
            "provider option",
            "given by the user",
        )
    default = _entry(ep, facts["default"], "default")
    return Device(ep, default.name, default.title, default.provider_options, "default",
                  f"{default.source}; the default because {facts['why_default']}", default.htp_arch)


def device_table() -> list[dict[str, Any]]:
    """Every device ortprep knows, for check --list-eps and the docs."""
    rows = []
    for ep, facts in device_facts().items():
        if ep == "sources":
            continue
        for name, entry in facts["devices"].items():
            rows.append({"ep": ep, "name": name, "title": entry["title"], "soc_model": entry.get("soc_model"),
                         "htp_arch": entry.get("htp_arch"), "aliases": entry.get("aliases", []),
                         "default": name == facts["default"]})
    return rows
