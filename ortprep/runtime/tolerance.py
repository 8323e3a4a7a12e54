"""Whether an EP's session computes float32 products in TF32 on this machine's GPU: what
fidelity.tolerances is told (``tf32``) to hold the session to float16's precision. Reads the GPU,
so it lives with the runtime. Sources: docs/decisions/fidelity-tolerances.md."""

from __future__ import annotations

from ortprep.fidelity.tolerances import TF32_COMPUTE

# TF32 exists on NVIDIA GPUs of compute capability 8.0 (Ampere) and later; on older ones use_tf32
# changes nothing and the session computes in float32.
TF32_LEAST_CAPABILITY = 8.0


def computes_tf32(ep: str, provider_options: dict[str, str] | None) -> bool:
    """Does this EP's session, with these provider options, compute float32 products in TF32
    (TF32_COMPUTE; on by default where the EP has the option) on this machine's GPU? Where the
    GPU's compute capability cannot be read (no nvidia-smi), TF32 is taken as on."""
    from ortprep.runtime.gpu import compute_capability

    option = TF32_COMPUTE.get(ep)
    if option is None or str((provider_options or {}).get(option, "1")).strip().lower() in ("0", "false"):
        return False
    capability = compute_capability(int((provider_options or {}).get("device_id", 0) or 0))
    return capability is None or capability >= TF32_LEAST_CAPABILITY
