"""What a judged decision assumed, which rule refused it, and the --metric values that confirm or
replace the assumption: added to its record, so that a refusal (and a pass that rests on the
evidence rule) says what the user can name instead of the guess (docs/decisions/gate-evidence.md)."""

from __future__ import annotations

from typing import Any

from ortprep.fidelity.decisions.evidence import CONFIDENCE, RULE
from ortprep.fidelity.decisions.margins import MAP_LEVELS
from ortprep.fidelity.decisions.shortfall import share_gaps

_LEVELS = f"{MAP_LEVELS[0]:g}-{MAP_LEVELS[-1]:g}"


def assumed(record: dict[str, Any]) -> list[str]:
    """The assumptions behind a judged decision, in words: the kind inferred from the output's
    form, a level no one named (the worst of MAP_LEVELS), the region match, the per-position rule."""
    said: list[str] = []
    label = record["kind"]
    if record.get("chosen_by") != "--metric":
        form = record.get("inferred_from") or "the output's form"
        said.append(f"{label} inferred from {form}")
    confidence = record.get("confidence") or {}
    if confidence.get("level_assumed"):
        what = "line score" if record["kind"] == "ctc" else "top-class probability"
        said.append(f"{what} threshold {confidence['level']:g} (the worst of the levels {_LEVELS} an application "
                    "may accept at)")
    one_level = len(record.get("region_levels") or {}) == 1  # map:T named its threshold
    if record.get("region_agreement") is not None and not (record.get("chosen_by") == "--metric" and one_level):
        match = record.get("region_match", "identical boxes")
        match = "their boxes stay identical" if match == "identical boxes" else f"their boxes match at {match}"
        level = "" if one_level else f", at {record['region_level']:g}, the worst of the levels {_LEVELS}"
        said.append(f"regions kept where {match}{level}")
    if record.get("per_position"):
        said.append("judged per position, not as whole sequences (an application decodes one position at a time)")
    return said


def confirm_with(record: dict[str, Any]) -> list[str]:
    """The --metric values (after OUTPUT=) that name the decision exactly: the first confirms what
    was assumed where it held worst, the others replace it."""
    kind = record["kind"]
    if kind == "top1":
        level = (record.get("confidence") or {}).get("level")
        return [f"top1:{level:g}", "top1"] if level is not None else ["top1"]
    if kind == "argmax":
        return ["argmax:positions", "argmax"] if record.get("per_position") else ["argmax", "argmax:positions"]
    if kind == "map":
        level = record.get("region_level", record.get("threshold"))
        return [f"map:{level:g}", f"map:{level:g}:exact", "cosine"] if level is not None else ["map", "cosine"]
    return []


def refused_by(record: dict[str, Any]) -> list[str]:
    """The shares that refused a judged decision, with the level they were held at where one was."""
    refused = []
    for what, asked, value in share_gaps(record):
        if value < asked and what not in refused:
            refused.append(what)
    confidence = record.get("confidence") or {}
    level = confidence.get("level")
    return [f"{what} at {level:g}" if what.endswith("confidence") and level is not None else what
            for what in refused]


def annotate(record: dict[str, Any]) -> dict[str, Any]:
    """Adds ``assumptions``, ``confirm_with`` and, refused, ``refused_by`` to a judged decision's
    record (and ``evidence_confidence``: the evidence rule's confidence level); returns it."""
    said = assumed(record)
    if said:
        record["assumptions"] = said
        record["confirm_with"] = confirm_with(record)
    if record.get("rule") == RULE:
        record["evidence_confidence"] = CONFIDENCE
    if record.get("passed") is False:
        record["refused_by"] = refused_by(record) or ["the decision could not be read"]
    return record


_SHARES = (("agreement", "agreement", "required"), ("whole sequences", "sequence_agreement", "required_sequences"),
           ("regions", "region_agreement", "required_regions"))


def evidence_shares(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each share the evidence rule judged: what, the share on the samples, the decisions it counts,
    its upper bound, the share asked, and the share expected on unseen inputs where one is."""
    found = []
    sources = [(what, record, key, asked) for what, key, asked in _SHARES]
    for part in ("confidence", "ranking"):
        nested = record.get(part) or {}
        level = nested.get("level")
        sources.append((part if level is None else f"{part} at {level:g}", nested, "agreement", "required"))
    for what, source, key, asked in sources:
        if source.get(f"{key}_upper") is None or source.get(asked) is None:
            continue
        expected = source.get("expected_agreement") if key == "agreement" else None
        found.append({"what": what, "share": source[key], "units": source.get(f"{key}_units"),
                      "upper": source[f"{key}_upper"], "required": source[asked], "expected": expected,
                      "expected_upper": source.get("expected_agreement_upper") if key == "agreement" else None,
                      "expected_units": source.get("expected_agreement_units") if key == "agreement" else None})
    return found


def held_on_evidence(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The shares of a passing decision below their bar on the samples, held because the samples
    are no evidence of a miss: where the exact rule (--metric) would have refused."""
    if record.get("passed") is not True or record.get("rule") != RULE:
        return []
    return [share for share in evidence_shares(record) if share["share"] < share["required"]
            or (share["expected"] is not None and share["expected"] < share["required"])]


def named(record: dict[str, Any], name: str) -> dict[str, Any]:
    """Adds ``replace_with`` (the --metric options, with the output's name) where the record says
    what confirms its assumptions; returns it."""
    if record.get("confirm_with"):
        record["replace_with"] = [f"--metric {name}={value}" for value in record["confirm_with"]]
    return record
