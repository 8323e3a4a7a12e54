"""fidelity/decisions/registry.py: every kind is registered once, in the order --metric lists it;
each declares its forms, its required share and how it is parsed; and fidelity runs no model."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ortprep.fidelity.decisions import KINDS, REQUIRED, Decision, parse_metric
from ortprep.fidelity.decisions.decision import KINDS as REGISTERED
from ortprep.fidelity.decisions.registry import ORDER


def test_every_kind_is_registered_once_in_the_metric_order():
    assert KINDS == ("top1", "argmax", "map", "detect", "ctc", "dfl", "cosine")
    assert set(REGISTERED) == set(KINDS) and [kind.name for kind in ORDER] == list(KINDS)
    assert REQUIRED == {"top1": 0.99, "argmax": 0.99, "map": 0.98, "detect": 0.98, "ctc": 0.95, "dfl": 0.99}


@pytest.mark.parametrize("text, label", [("top1", "top1"), ("top1:0.8", "top1:0.8"), ("argmax", "argmax"),
                                         ("argmax:positions", "argmax:positions"), ("map", "map:0.5"),
                                         ("map:0.3", "map:0.3"), ("map:0.3:exact", "map:0.3:exact"),
                                         ("detect", "detect:0.25"), ("ctc", "ctc"),
                                         ("ctc:-1", "ctc:-1"), ("dfl", "dfl"), ("dfl:8", "dfl:8"),
                                         ("cosine", "cosine")])
def test_each_form_parses_to_its_kind(text, label):
    decision = parse_metric(text)
    assert isinstance(decision, Decision) and decision.chosen_by == "--metric" and decision.label() == label
    assert decision.record()["required"] == REQUIRED.get(decision.kind)


def test_a_value_only_where_the_kind_takes_one():
    for text in ("cosine:1", "unknown", "detect:0.2:exact"):
        with pytest.raises(ValueError, match="is not a metric|between 0 and 1"):
            parse_metric(text)
    for text, words in (("top1:2", "lies between 0 and 1"), ("argmax:0.5", "only 'positions'"),
                        ("map:0.3:boxes", "map:T:exact"), ("map:exact", "map:T:exact")):
        with pytest.raises(ValueError, match=words):
            parse_metric(text)


def test_fidelity_imports_no_runtime_and_no_onnxruntime():
    root = Path(__file__).resolve().parent.parent / "ortprep" / "fidelity"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith(("onnxruntime", "ortprep.runtime", "ortprep.steps", "ortprep.transforms",
                                            "ortprep.eps", "ortprep.model")), f"{path.name} imports {name}"
