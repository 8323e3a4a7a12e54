from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(1, str(ROOT))  # tools/ (the fuzz cases) for tests/test_fuzz.py

SAMPLE_MODELS = sorted(p for p in SAMPLES.rglob("*.onnx"))
HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None

# Finding codes no test on this kind of machine can raise, and why. Every other code in the
# catalogue must be raised by at least one test of a full run (checked at the end of the session).
ENVIRONMENT_ONLY = {
    "DOC001": "needs two ONNX Runtime flavours installed side by side",
    "DOC002": "needs onnxruntime-gpu with a CUDA/TensorRT library missing",
    "DOC004": "needs pycuda or another CUDA context owner installed next to onnxruntime-gpu",
    "LOD010": "needs onnxruntime-gpu on a GPU with TF32 (compute capability 8.0 or later): tests/test_gpu.py",
}
# Of those, the codes a machine with onnxruntime-gpu's CUDA EP raises in its own right (the GPU
# tests): raised there, they are not stale.
GPU_RAISED = {"DOC002", "LOD010"}
RAISED_CODES: set[str] = set()

def saw_codes(record: dict) -> None:
    """Count the findings of a report made in a child process (the hook below sees only this one)."""
    RAISED_CODES.update(f["code"] for f in record.get("findings", []))


@pytest.fixture
def samples() -> Path:
    return SAMPLES


def pytest_configure(config):
    """Record every finding code a test makes ortprep raise."""
    from ortprep.findings import Finding

    original = Finding.of.__func__

    def recording(cls, code, message, **fields):
        RAISED_CODES.add(code)
        return original(cls, code, message, **fields)

    Finding.of = classmethod(recording)


def pytest_report_header(config):
    # Without ONNX Runtime the modules that import it fail at collection, on purpose: a suite that
    # silently skips most of itself would pass on a broken install. This line says why.
    return (
        None
        if HAVE_ORT
        else "onnxruntime is not installed: the modules that need it fail to collect (run: make install)"
    )


def _full_run(session) -> bool:
    config = session.config
    args = [Path(a).resolve() for a in config.args]
    return (args == [ROOT / "tests"] and not config.option.keyword and not config.option.markexpr
            and not getattr(config.option, "lf", False) and not getattr(config.option, "deselect", None) and HAVE_ORT
            and not config.option.collectonly)


def pytest_sessionfinish(session, exitstatus):
    """A full run must raise every catalogued finding code at least once."""
    from ortprep.findings import CATALOGUE

    if exitstatus != 0 or not _full_run(session):
        return
    missing = sorted(set(CATALOGUE) - RAISED_CODES - set(ENVIRONMENT_ONLY))
    stale = set(ENVIRONMENT_ONLY) & RAISED_CODES
    if stale & GPU_RAISED:
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            stale -= GPU_RAISED
    stale = sorted(stale)
    if missing or stale:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("")
        if missing:
            reporter.write_line(f"finding codes no test raised: {', '.join(missing)}", red=True)
        if stale:
            reporter.write_line(f"codes listed as environment-only but raised: {', '.join(stale)}", red=True)
        session.exitstatus = 1
