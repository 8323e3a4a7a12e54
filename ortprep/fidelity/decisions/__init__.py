"""What an application decides from a model's outputs, and whether two models decide the same:
cosine on a tensor can stay above 0.99 while a classifier's answer flips or a recogniser reads
another character, so each output gets a decision where its form says what is read from it. One
module per kind (classes, sequences, maps, detections, dfl, ctc, cosine), each declaring how it is
inferred, measured and what share it requires; registry.py dispatches. ``--metric OUTPUT=KIND``
overrides the inference for one output."""

from ortprep.fidelity.decisions.assumptions import evidence_shares, held_on_evidence, named
from ortprep.fidelity.decisions.classes import CLASS_GAP, confidence_agreement
from ortprep.fidelity.decisions.ctc import CTC_BLANK, CTC_REPLACES_COSINE, ctc_agreement, ctc_strings
from ortprep.fidelity.decisions.decision import Decision, Kind
from ortprep.fidelity.decisions.evidence import CONFIDENCE
from ortprep.fidelity.decisions.detections import (DETECT_BOX_SLACK, DETECT_MIN_SCENES, DETECT_NMS_IOU,
                                                   DETECT_THRESHOLD, REQUIRED_SCENES, detections, detector_rows,
                                                   expected_scene_agreement, scene_margin)
from ortprep.fidelity.decisions.dfl import DFL_LIMIT, DFL_SLACK, dfl_distances, dfl_hint
from ortprep.fidelity.decisions.maps import MAP_THRESHOLD, REQUIRED_REGIONS, region_agreement, regions
from ortprep.fidelity.decisions.margins import MAP_LEVELS, held_at_levels
from ortprep.fidelity.decisions.registry import (KINDS, REQUIRED, agreement, expected_agreement, infer_decisions,
                                                 judge_decision, label_of, parse_metric)
from ortprep.fidelity.decisions.sequences import (REQUIRED_SEQUENCES, expected_sequence_agreement,
                                                  sequence_agreement)
from ortprep.fidelity.decisions.shortfall import decision_shortfall, margin_shortfall, share_gaps, with_margin

__all__ = [
    "CLASS_GAP", "CONFIDENCE", "CTC_BLANK", "CTC_REPLACES_COSINE", "DETECT_BOX_SLACK", "DETECT_MIN_SCENES",
    "DETECT_NMS_IOU", "DETECT_THRESHOLD", "DFL_LIMIT", "DFL_SLACK", "KINDS", "MAP_LEVELS", "MAP_THRESHOLD",
    "REQUIRED", "REQUIRED_REGIONS", "REQUIRED_SCENES", "REQUIRED_SEQUENCES", "Decision", "Kind", "agreement",
    "confidence_agreement", "ctc_agreement", "ctc_strings", "decision_shortfall", "detections", "detector_rows",
    "dfl_distances", "dfl_hint", "evidence_shares", "expected_agreement", "expected_scene_agreement",
    "expected_sequence_agreement", "held_at_levels", "held_on_evidence", "infer_decisions", "judge_decision",
    "label_of", "margin_shortfall", "named", "parse_metric", "region_agreement", "regions", "scene_margin",
    "sequence_agreement", "share_gaps", "with_margin",
]
