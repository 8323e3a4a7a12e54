# SHIM(integration): re-exports ortprep.fidelity.decisions for code not yet moved to it.
"""Moved to ortprep.fidelity.decisions (one module per kind, registry.py dispatches)."""

from ortprep.fidelity.decisions import *  # noqa: F401,F403
from ortprep.fidelity.decisions import __all__  # noqa: F401
