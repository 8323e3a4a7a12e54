"""Where the real EPs this machine may run are: QNN's HTP simulator (onnxruntime-qnn, x86 builds
only) and OpenVINO's CPU device (its own environment, .venv-openvino). `make install` sets up both;
without them the tests marked here skip with the reason."""

from __future__ import annotations

import importlib.util
import platform

import pytest

from conftest import ROOT

X86 = platform.machine() in ("x86_64", "AMD64")
HAVE_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None and X86
OPENVINO_PYTHON = ROOT / ".venv-openvino" / "bin" / "python"
needs_qnn = pytest.mark.skipif(not HAVE_QNN, reason="onnxruntime-qnn (x86 simulator) is not installed "
                                                    "(make install adds it)")
needs_openvino = pytest.mark.skipif(not OPENVINO_PYTHON.exists(),
                                    reason="no .venv-openvino with onnxruntime-openvino (make install creates it)")
on_x86 = pytest.mark.skipif(not X86, reason="the simulators are x86 builds")
