"""What this machine's CPU does with int8 arithmetic, where it changes a quantized model's results.

On x86-64 CPUs without VNNI (AVX2, AVX-512 without VNNI), ONNX Runtime's CPU kernels multiply
uint8 activations by int8 weights with an instruction whose 16-bit intermediate sums saturate, so
a U8S8 model can compute something else there than on a VNNI CPU (the ONNX Runtime docs, "Quantize
ONNX models", data type selection; OpenVINO's "Saturation (overflow) issue workaround" explains
the instruction). The documented remedy is 7-bit weights (reduce_range). The measurement on this
kind of CPU: docs/decisions/docs-cpu-int8-saturation.md.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

SOURCE = (
    "ONNX Runtime docs, Quantize ONNX models (onnxruntime.ai/docs/performance/model-optimizations/quantization.html): "
    "U8S8 on x86-64 without VNNI may saturate, use reduce_range; measured here (runtime/cpu.py)"
)
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "avx_vnni_int8")


@lru_cache(maxsize=1)
def int8_saturates() -> bool | None:
    """True when this CPU is x86-64 without a VNNI instruction (U8S8 may saturate), False when it
    has one or is not x86, None when it cannot be told (no /proc/cpuinfo)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i386", "i686"):
        return False
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return None
    try:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        return None
    return not any(flag in flags for flag in VNNI_FLAGS)
