from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(ROOT / "tests"))

SAMPLE_MODELS = sorted(p for p in SAMPLES.rglob("*.onnx"))


@pytest.fixture
def samples() -> Path:
    return SAMPLES
