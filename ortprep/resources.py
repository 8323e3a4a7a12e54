"""What the machine has for a step: memory available now, and the refusal, with the numbers, of a
step that would have to hold more weights than fit."""

from __future__ import annotations

from ortprep.errors import EnvironmentMissingError
from ortprep.model import ModelHandle


def available_memory() -> int | None:
    """Bytes of memory available now (MemAvailable on Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def require_memory(handle: ModelHandle, step: str, factor: float = 1.0) -> None:
    """Refuse, with the numbers, a step that must hold the weights in memory when they alone are
    more than the machine has available (it would fail or swap after minutes of work)."""
    needed = handle.estimated_size()
    available = available_memory()
    if available is not None and needed * factor > available:
        raise EnvironmentMissingError(
            f"{step} needs the model's {needed / 2**30:.1f} GiB of tensors in memory"
            + (f" (about {factor:g}x while it works)" if factor != 1.0 else "")
            + f"; this machine has {available / 2**30:.1f} GiB available",
            hint="run it on a machine with more memory; inspect and check read no weights and work on any size")
