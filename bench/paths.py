"""Where the bench lives and writes, and the repository's helper modules it reuses by file.

Standard library only: the apps' own environment imports it too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
OUT = BENCH / "out"  # every run's outputs (git-ignored)


def repo_module(relative: str, name: str) -> ModuleType:
    """A repository file that is not in a package (tests/models.py, sample_models/build.py), loaded
    once by its path under a private name: no sys.path entry, no clash with a module of the same name."""
    key = f"_bench_repo_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def test_models() -> ModuleType:
    """tests/models.py: the tiny graphs the tests build (make, vit_like, ...)."""
    return repo_module("tests/models.py", "test_models")


def sample_builders() -> ModuleType:
    """sample_models/build.py: the sample models' builders."""
    return repo_module("sample_models/build.py", "sample_models_build")
