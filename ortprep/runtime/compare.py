# SHIM(integration): re-exports ortprep.fidelity (compare, graph, gate) for code not yet moved to it.
"""Moved to ortprep.fidelity: compare.py (OutputDiff, compare_arrays, degenerate), graph.py
(output_bounds, the pass-through ops) and gate.py (expect)."""

from ortprep.fidelity.compare import Degenerate, OutputDiff, compare_arrays, compare_outputs, degenerate  # noqa: F401
from ortprep.fidelity.gate import expect  # noqa: F401
from ortprep.fidelity.graph import BOUNDED, output_bounds  # noqa: F401
from ortprep.fidelity.graph import RANGE_KEEPING as PASS_THROUGH  # noqa: F401
