"""Facts about this machine's NVIDIA GPU that decide how an EP computes, read from the driver's
own tool (nvidia-smi), once per process."""

from __future__ import annotations

import functools
import shutil
import subprocess


@functools.lru_cache(maxsize=8)
def compute_capability(device_id: int = 0) -> float | None:
    """The compute capability (8.0 for an A100, 9.0 for an H100 or H200) of GPU ``device_id``, or
    None where it cannot be read: no NVIDIA driver tool, no such GPU, or a driver too old to
    report it."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or device_id >= len(lines):
        return None
    try:
        return float(lines[device_id])
    except ValueError:
        return None
