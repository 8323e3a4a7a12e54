"""The registry of decompositions, and the choice of one for a node from an EP's own table: the
first (in the order written here, simplest first) whose opsets fit the model's and whose every
produced op the EP's table takes at that opset."""

from __future__ import annotations

from ortprep.eps.tables import SupportTable
from ortprep.model import normalize_domain
from ortprep.transforms.decompose.activations import ACTIVATIONS
from ortprep.transforms.decompose.base import Decomposition, schema_since
from ortprep.transforms.decompose.einsum import EINSUMS
from ortprep.transforms.decompose.gelu import GELUS
from ortprep.transforms.decompose.normalization import NORMALIZATIONS

REGISTRY: tuple[Decomposition, ...] = ACTIVATIONS + GELUS + NORMALIZATIONS + EINSUMS


def for_op(domain: str, op: str) -> list[Decomposition]:
    """The decompositions of ``op`` in ``domain``, in order of preference."""
    wanted = normalize_domain(domain)
    return [d for d in REGISTRY if d.op == op and normalize_domain(d.domain) == wanted]


def ep_takes(table: SupportTable, op: str, opset: int) -> bool:
    """Whether ``table`` lists the ai.onnx ``op`` for the schema in force at ``opset``."""
    since = schema_since(op, opset)
    return since is not None and any(entry.covers(since) for entry in table.lookup("", op))


def choose(table: SupportTable, domain: str, op: str, opset: int) -> Decomposition | None:
    """The first decomposition of ``op`` written for ``opset`` whose ops ``table`` all takes."""
    for decomposition in candidates(table, domain, op, opset):
        return decomposition
    return None


def candidates(table: SupportTable, domain: str, op: str, opset: int) -> list[Decomposition]:
    """Every decomposition of ``op`` that fits ``opset`` and whose ops ``table`` takes, in order."""
    return [d for d in for_op(domain, op) if d.fits(opset) and all(ep_takes(table, p, opset) for p in d.produces)]
