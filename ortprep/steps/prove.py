# SHIM(integration): re-exports ortprep.prove.proof for bench/bench_prove.py; not a step
"""Moved to :mod:`ortprep.prove.proof`; the lead removes this shim once bench imports
``ortprep.session_caller``."""

from ortprep.prove.proof import compare_prediction, prove_targets, session_caller  # noqa: F401
