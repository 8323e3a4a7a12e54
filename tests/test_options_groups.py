"""Option groups (ortprep/options/groups.py) are declared once: every command that has one of them
reads, parses and checks it the same way, package included."""

from __future__ import annotations

import pytest

from ortprep.options import cli_flags, convert_value, spec_of
from ortprep.options.package import PackageSharedOptions
from ortprep.steps import REGISTRY, options_class

SHARED = ("metrics", "runtimes", "provider_options", "device", "calib", "eval", "shapes")


def _fields(cls):
    return {f.name: f for f in cls.fields()}


@pytest.mark.parametrize("name", SHARED)
def test_a_group_has_one_kind_flags_and_metavar_everywhere(name):
    owners = [options_class(step) for step in REGISTRY] + [PackageSharedOptions]
    found = [_fields(cls)[name] for cls in owners if name in _fields(cls)]
    assert len(found) >= 2, f"{name} is shared by at least two commands"
    kinds = {spec_of(f).kind for f in found}
    flags = {tuple(cli_flags(f)) for f in found}
    metavars = {spec_of(f).metavar for f in found}
    assert len(kinds) == 1 and len(metavars) == 1 and len(flags) == 1


def test_package_parses_its_shared_options_as_the_steps_do(tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    given = {"metrics": ["Logits=TOP1"], "runtimes": [f"cpu={python}"], "shapes": ["x=1,3,8,8"], "calib": "random"}
    package = PackageSharedOptions.from_values(given, where="package")
    load = options_class("load").from_values({k: given[k] for k in ("metrics", "runtimes", "shapes")}, where="load")
    assert (package.metrics, package.runtimes, package.shapes) == (load.metrics, load.runtimes, load.shapes)
    quantize_calib = [f for f in options_class("quantize").fields() if f.name == "calib"][0]
    assert package.calib == convert_value(quantize_calib, "random", "quantize", None) == "random"
