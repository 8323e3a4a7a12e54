# SHIM(integration): re-exports ortprep.prove (culprits, fixes) for bench/bench_prove.py; not a step
"""Moved to :mod:`ortprep.prove`; the lead removes this shim once bench imports ``ortprep.reduce_failure``
and ``ortprep.find_fix``."""

from ortprep.prove.culprits import reduce_failure  # noqa: F401
from ortprep.prove.fixes import find_fix  # noqa: F401
