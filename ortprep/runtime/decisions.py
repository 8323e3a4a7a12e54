"""What an application decides from a model's outputs, and whether two models decide the same.

Cosine on a tensor can stay above 0.99 while a classifier's answer flips or a CTC recogniser
reads another character (measured in bench/apps: a captcha OCR at cosine 0.99+ with 5 of 30
strings changed). So each output gets a *decision* where its form says what the application
reads from it:

- ``top1``: class scores, an output of shape [N, C] (C >= 2): the argmax per row. Gated when the
  output is made by a Softmax, holds probabilities (rows in [0, 1] summing to 1), or its rows'
  largest value stands out (the median gap to the second, in the row's standard deviations, is at
  least :data:`CLASS_GAP`), or its name says class scores (logits, scores, probs, classes, labels,
  tags, preds); a raw [N, C] output with neither may be an embedding, where an argmax means
  nothing: its top-1 agreement is reported, not gated (``--metric NAME=top1`` gates it);
- ``argmax``: sequence logits, [N, T, C] with C >= 2 made by a Softmax/LogSoftmax over the last
  axis (through reshapes and transposes), or raw scores per position with such a gap or such a
  name: the argmax per position, what a CTC decoder or a frame tagger reads; also a 2-D [T, C]
  whose rows are the positions of one input's sequence (see :func:`_rows_are_positions`);
- ``map``: a probability map, made by a Sigmoid (or, with one channel, a Softmax) with values
  in [0, 1]: the elements above a threshold (0.5, or ``map:T``), compared by F1; and, for a map
  with two spatial axes, the connected regions above each of :data:`MAP_LEVELS` (or above T alone),
  compared by their bounding boxes (see :func:`region_agreement`); a [N, C] map made by a Sigmoid
  (a recommender's candidates, a multi-label tagger's labels) is *ranked* too: each row's
  best-scored class held to the ``top1`` bar (``map`` given by ``--metric`` is not ranked);
- ``ctc[:BLANK]``: a CTC recogniser's per-position scores, read as its greedy decoder reads them:
  the argmax per position, repeats merged, the blank (index BLANK, default 0, PaddleOCR's and
  ddddocr's; negative counts from the end) dropped. The decoded strings must be equal (see
  :data:`CTC_REPLACES_COSINE`). Never inferred: ``--metric OUTPUT=ctc``;
- ``dfl[:BINS]``: a box regression head that gives each side of a box as a distribution over
  BINS distances (distribution focal loss: GFL, NanoDet, PP-PicoDet, YOLOv8 before its decoding),
  [..., 4 x BINS] or [..., 4 x BINS, N]: read as its application reads it, each side's expected
  distance (the softmax over the bins times 0..BINS-1), compared in bins (see :data:`DFL_SLACK`).
  Never inferred: ``--metric OUTPUT=dfl``;
- ``cosine``: no decision; cosine and the norm ratio alone.

A ``top1`` output inferred from probability rows (values in [0, 1], each row summing to 1) is
also held by its *confidence*: an application often accepts the top class only above a threshold
of its own (magika's per-type thresholds turn a weak answer into ``unknown``; PP-OCR's direction
classifier rotates a line only above 0.9), and ortprep is not told it, so the top class's
probability is held at each of :data:`MAP_LEVELS` as a map is, the worst level counting
(``Decision.confident``; ``--metric OUTPUT=top1`` judges the class alone).

``--metric OUTPUT=KIND`` overrides the inference for one output. Agreement is pooled over the
samples; :data:`REQUIRED` is what the gate asks of each kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("top1", "argmax", "map", "detect", "ctc", "dfl", "cosine")
# What the gate asks: the share of rows (top1) or positions (argmax) whose argmax agrees, and the
# F1 of the thresholded map. The bench's application bars (bench/apps): labels >= 99% equal,
# strings >= 95%, VAD frames >= 98%: a string of 20 positions is equal only when every position is.
REQUIRED = {"top1": 0.99, "argmax": 0.99, "map": 0.98, "detect": 0.98, "ctc": 0.95, "dfl": 0.99}
# An argmax decision is read as a whole sequence (a CTC string, a frame tagging): the share of
# sequences equal in every position must reach this too (the bench's bar for strings: 95%). At
# 99% per position, a 48-step sequence is whole on about 62% of inputs.
REQUIRED_SEQUENCES = 0.95
# A CTC decoder merges repeats before it drops blanks, so a position that turns from a repeated
# character to the blank at the edge of its run changes nothing it reads, while the output's
# cosine drops by about that position's share of the sequence. Measured on rapidocr's PP-OCRv6
# recogniser ([1, 40, 18710] probabilities, the NPU journey's 24 calibration lines): FP16 moved
# two positions (33 33 -> 0 33 at p = 0.58, 63 63 -> 63 0 at 0.37), both lines' text unchanged,
# one at cosine 0.9973, below quantize's 0.995 aim only by that position. So ``ctc`` replaces the
# output's cosine floor (quantize's gate, convert's verification, load's and compile's tolerance):
# the strings, their expected agreement, the lines' scores and the norm ratio judge it instead.
CTC_REPLACES_COSINE = True
CTC_BLANK = 0
# A class score's lead over the runner-up, in the row's standard deviations, below which a raw
# output may be an embedding (the largest of 512 Gaussian values leads the second by about 0.3).
CLASS_GAP = 1.0
MAP_THRESHOLD = 0.5
# A YOLO-style detector's output ([1, 4 + C, N] or [1, N, 4 + C]: a box's centre and size in pixels,
# then a score per class, no objectness) holds boxes beside scores, and its cosine weighs the
# boxes: measured on the NPU journey's YOLOv8n (NudeNet), A16W8 at cosine 0.9998 lost or moved 2 of
# the float model's 3 detections on 100 fresh scenes (bench/yolo_app.py). ``detect:T`` judges what
# a detector's application reads: its detections after non-maximum suppression (score >= T, IoU
# DETECT_NMS_IOU), matched by class and overlap, their F1, and the boxes of the matched ones, each
# coordinate within DETECT_BOX_SLACK pixels (the share held to REQUIRED_REGIONS). What to expect
# on unseen inputs comes from the (class, anchor) scores' distance to T, as for a map (before NMS:
# a cautious estimate, since a duplicate anchor that crosses T changes nothing after it). Default
# T and the IoU: NudeNet 3.4.2's NMS.
DETECT_THRESHOLD = 0.25
DETECT_NMS_IOU = 0.45
DETECT_MATCH_IOU = 0.5
DETECT_BOX_SLACK = 2.0
# What a detector's application returns per input is the scene's whole set of detections, and a
# scene is right only when every one of them is: a scene is held as a label is (REQUIRED["top1"]).
# The per-score estimate above counts every (class, anchor) score as a decision, so a detector of
# 2,100 anchors x 18 classes whose scenes mostly hold nothing expects 99.998% while a whole scene
# is lost: measured on the bench's YOLOv8n (NudeNet 320n), static int8 kept every detection of its
# 8 held-back scenes (none had one) and lost 1 of the 2 that 100 fresh scenes held (0.267 -> 0.235
# at T = 0.25); ORT's static int8 put the class scores beside the pixel boxes in one 8-bit range and
# detected nothing at all. So each scene is also one decision: its margin is its anchors' best
# class score nearest T (less the anchors a kept detection suppresses), and the error is how far
# the candidate moves those scores near T, either way (a candidate that
# lowers every score keeps the empty scenes and loses every detection; the side a score falls on
# is not what it moves). Both are read as logits: a class score is a sigmoid, whose slope near 0 is
# a tenth of its slope at 0.25, so the scores of an empty scene, all near 0, would otherwise say
# that the scores at T barely move. The errors come from the evaluated samples' scores within
# DETECT_LOGIT_BAND of T's logit (odds within e^1.5 of T's: 0.069 to 0.60 at 0.25), pooled over the
# samples, at least the DETECT_NEAREST nearest to T. Not per sample: an empty scene's nearest
# scores sit near 0, where the output's own rounding is magnified as a logit (the journey's A16W16
# YOLOv8n, whose one output holds the pixel boxes too, rounds scores in steps of 0.005, a move of 3
# logits at 0.005 and of 0.03 at T; taking each sample's nearest 16 expected 81.7% of its scenes
# kept at cosine 0.99999998).
REQUIRED_SCENES = REQUIRED["top1"]
# The scenes' estimate needs scenes: with one, _flip_rate's line through the origin puts half of
# all unseen scenes at that one scene's margin. Below this many float scenes (the samples quantize's
# gate holds back, calibrate.MIN_EVAL_SAMPLES), load's and compile's hold of one or a few inputs, it is not made
# (expected_scene_agreement None) and the scenes seen and the per-score estimate judge. Measured:
# the NPU journey's YOLOv8n in FP16 on QNN's HTP, one input in load: 97.9% expected from its one
# scene, while quantize's gate, over 8 held-back scenes and 16 more, expected 100.0% of the same file.
DETECT_MIN_SCENES = 8
DETECT_LOGIT_BAND = 1.5
DETECT_NEAREST = 16
_LOGIT_CLIP = 1e-4
# a score the candidate makes NaN or infinite: moved farther than any margin (the clipped logits
# span +-9.2)
_UNREAD_MOVE = 40.0
# A DFL box head's logits are not what its application reads: it decodes each side's distance as
# the expected bin of a softmax, and multiplies it by the level's stride (rapid-layout 1.2.1's
# PPPostProcess; the same in GFL, NanoDet, YOLOv8). The logits' max abs diff judges them otherwise:
# measured on the NPU journey's layout detector (PP-PicoDet, 4 levels of [1, N, 32]), FP16 on QNN's
# HTP was 0.04-0.24 off the CPU EP's run of the same file where load allows 0.058, while
# rapid-layout's own post-processing kept every box of 12 fresh pages at IoU >= 0.98 (bench/RESULTS.md,
# "The layout detector's FP16 on QNN, by its application"). ``dfl`` judges the decoded distances:
# at least REQUIRED["dfl"] of the sides within DFL_SLACK bins, and none beyond DFL_LIMIT. A quarter
# bin is 2 px at the finest level of stride 8 (DETECT_BOX_SLACK), and a coarser level's boxes are
# as much larger as its stride; a whole bin is another box at any level.
DFL_SLACK = 0.25
DFL_LIMIT = 1.0
# Rows of independent scores from a Sigmoid ([N, C], C >= 2) are thresholded by some applications
# and ranked by others, and ortprep is not told which: both are held (Decision.ranked). Measured on
# the NPU journey's recommender (50 candidates' scores, bench/decision_rates.py): its A16W8 model
# kept the map at 0.5 (F1 1.0, 99.97% expected) while its best-scored candidate changed on 19 of
# 400 fresh inputs.
RANKED_MIN_CLASSES = 2

# What an application that boxes a map (a text or object detector: threshold, connected regions, a
# box per region, a crop per box) reads from it is its regions' boxes, and a box one pixel off is a
# different crop. Measured on rapidocr's PP-OCRv6 detector (bench/apps): FP16 kept the map's F1 at
# 0.9993 while 9% of its boxes moved by a pixel, and the moved crops changed the recogniser's text
# (CER 1.26% against the float pipeline, over the app's 1% bar). So a map is also judged by the
# share of its regions whose bounding box stays the same, at least REQUIRED_REGIONS (the bar of
# whole units elsewhere: a CTC string, REQUIRED_SEQUENCES).
REQUIRED_REGIONS = 0.95
# The threshold an application boxes a map at is its own (DB text detectors 0.3, masks 0.5), and
# ortprep is not told it: without ``map:T`` the regions are judged at every tenth of the range and
# the worst level counts. The levels are also several probes of how far the candidate moves the
# map's contours, where one sample shows few regions at any one level.
MAP_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# At most this many 2-D planes (over the samples and the leading axes) are labelled per level: a
# map of many channels costs a labelling per channel, level and sample.
_REGION_PLANES = 64
_PASS_THROUGH = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "DequantizeLinear",
                 "QuantizeLinear")


@dataclass(frozen=True)
class Decision:
    kind: str  # one of KINDS
    threshold: float | None = None  # map: the probability threshold
    chosen_by: str = "inferred"  # "inferred" from the output's form, or "--metric"
    gated: bool = True  # False: reported beside cosine, not part of the gate
    # map: True when --metric named the threshold (map:T): its regions are judged there alone
    threshold_given: bool = field(default=False, compare=False)
    # map: True for rows of independent scores ([N, C] from a Sigmoid: a recommender's candidates,
    # a multi-label tagger's labels): an application ranks them too, so each row's best-scored
    # class is held to the top-1 bar beside the map (see RANKED_MIN_CLASSES)
    ranked: bool = field(default=False, compare=False)
    # top1: True for probability rows (inferred): the top class's probability is held at each of
    # MAP_LEVELS too, as an application that accepts a class above a threshold reads it
    confident: bool = field(default=False, compare=False)
    # ctc: the blank's class index (negative: from the end)
    blank: int = CTC_BLANK
    # dfl: the bins per side (None: the axis of 4 x BINS values, divided by 4)
    bins: int | None = None

    @property
    def reads_margins(self) -> bool:
        """Whether the agreement to expect on unseen inputs is estimated from the float model's
        margins (how near each decision sits to its boundary): not for ``cosine`` (no decision)
        nor ``dfl`` (distances, judged as they move)."""
        return self.kind not in ("cosine", "dfl")

    @property
    def replaces_cosine(self) -> bool:
        """Whether this decision, gated, judges its output in place of the cosine floor (``ctc``)."""
        return self.kind == "ctc" and self.gated and CTC_REPLACES_COSINE

    def label(self) -> str:
        if self.kind == "ctc":
            return "ctc" if self.blank == CTC_BLANK else f"ctc:{self.blank}"
        if self.kind == "dfl":
            return "dfl" if self.bins is None else f"dfl:{self.bins}"
        return f"{self.kind}:{self.threshold:g}" if self.kind in ("map", "detect") else self.kind

    def record(self) -> dict[str, Any]:
        record = {"kind": self.kind, "threshold": self.threshold, "chosen_by": self.chosen_by, "gated": self.gated,
                  "required": REQUIRED.get(self.kind) if self.gated else None}
        if self.ranked:
            record["ranked"] = True
        if self.confident:
            record["confident"] = True
        if self.kind == "ctc":
            record.update(blank=self.blank, replaces_cosine=self.replaces_cosine)
        if self.kind == "dfl":
            record.update(bins=self.bins, slack_bins=DFL_SLACK, limit_bins=DFL_LIMIT)
        return record


def parse_metric(text: str) -> Decision:
    """``top1``, ``argmax``, ``map``, ``map:0.3``, ``detect``, ``detect:0.25``, ``ctc``, ``ctc:-1``,
    ``dfl``, ``dfl:8`` or ``cosine`` (ValueError otherwise)."""
    kind, _, value = text.strip().lower().partition(":")
    if kind not in KINDS or (value and kind not in ("map", "detect", "ctc", "dfl")):
        raise ValueError(f"{text!r} is not a metric: use one of top1, argmax, map, map:THRESHOLD, detect, "
                         "detect:THRESHOLD, ctc, ctc:BLANK, dfl, dfl:BINS, cosine")
    if kind == "dfl":
        try:
            bins = int(value) if value else None
        except ValueError:
            bins = 0
        if bins is not None and bins < 2:
            raise ValueError(f"{text!r}: the number after 'dfl:' is the bins per box side (reg_max + 1, at least 2)")
        return Decision("dfl", None, "--metric", bins=bins)
    if kind == "ctc":
        try:
            blank = int(value) if value else CTC_BLANK
        except ValueError:
            raise ValueError(f"{text!r}: the number after 'ctc:' is the blank's class index (0, or -1 for the last)"
                             ) from None
        return Decision("ctc", None, "--metric", blank=blank)
    threshold = None
    if kind in ("map", "detect"):
        try:
            threshold = float(value) if value else MAP_THRESHOLD if kind == "map" else DETECT_THRESHOLD
        except ValueError:
            raise ValueError(f"{text!r}: the threshold after '{kind}:' is a number between 0 and 1") from None
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"{text!r}: a {kind} threshold lies between 0 and 1")
        if kind == "detect" and not 10 * _LOGIT_CLIP <= threshold <= 1.0 - 10 * _LOGIT_CLIP:
            # the scenes' margins are read as logits of scores clipped at _LOGIT_CLIP: nearer 0 or 1,
            # a score and T would tie
            raise ValueError(f"{text!r}: a detect threshold lies between {10 * _LOGIT_CLIP:g} and {1 - 10 * _LOGIT_CLIP:g}")
    return Decision(kind, threshold, "--metric", threshold_given=bool(value))


def _maker(proto, name: str) -> str | None:
    """The op that makes ``name``, looking through reshapes, transposes, casts and Q/DQ."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    seen = 0
    while name in producers and seen < 16:
        node = producers[name]
        if node.op_type not in _PASS_THROUGH or not node.input:
            return node.op_type
        name, seen = node.input[0], seen + 1
    return None


def _rows_are_positions(proto, name: str, rows: int) -> bool:
    """Whether the rows of a 2-D output [R, C] are the positions of one input's sequence rather than
    a batch: its first dim shares a symbolic name with a non-leading dim of an input ("frames"), or
    every input is a batch of one and R is the length T of a sequence input [1, T, features] (a
    frame tagger fixed to 48 frames: input [1, 48, 40], output [48, 4])."""
    if rows < 2:
        return False
    initializers = {t.name for t in proto.graph.initializer}
    inputs = [v for v in proto.graph.input if v.name not in initializers and v.type.HasField("tensor_type")
              and v.type.tensor_type.HasField("shape")]
    output = next((v for v in proto.graph.output if v.name == name), None)
    first = None
    if output is not None and output.type.HasField("tensor_type") and output.type.tensor_type.HasField("shape"):
        dims = output.type.tensor_type.shape.dim
        first = dims[0].dim_param if dims and dims[0].HasField("dim_param") else None
    batch_of_one, sizes, names = bool(inputs), set(), set()
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if len(dims) < 2:
            continue
        batch_of_one = batch_of_one and dims[0].HasField("dim_value") and dims[0].dim_value == 1
        for dim in dims[1:]:
            if dim.HasField("dim_param"):
                names.add(dim.dim_param)
        if len(dims) == 3 and dims[1].HasField("dim_value"):
            sizes.add(dims[1].dim_value)  # a sequence input [1, T, features]: its T, not channels or sizes
    return bool(first and first in names) or (batch_of_one and rows in sizes)


def infer_decisions(proto, reference: list[dict[str, np.ndarray]], overrides: dict[str, str] | None = None
                    ) -> dict[str, Decision]:
    """Each float output's decision, from its shape over the samples, its values and the op that
    makes it (``proto``: the float model); ``overrides``: output -> metric text (--metric)."""
    decisions: dict[str, Decision] = {}
    overrides = overrides or {}
    for name in (reference[0] if reference else {}):
        if name in overrides:
            decisions[name] = parse_metric(overrides[name])
            continue
        values = [np.asarray(sample[name]) for sample in reference if name in sample]
        if not values or values[0].dtype.kind != "f":
            continue
        shape = values[0].shape
        maker = _maker(proto, name)
        if maker in _FEATURE_MAKERS and not _named_as_classes(name):
            continue  # hidden states: no class is read from them (the cosine and the norm hold them)
        low = min(float(np.nanmin(v)) for v in values if v.size)
        high = max(float(np.nanmax(v)) for v in values if v.size)
        probability = 0.0 <= low and high <= 1.0
        if len(shape) == 2 and shape[-1] >= 2 and maker != "Sigmoid":
            probabilities = _probability_rows(values)
            distribution = maker in ("Softmax", "LogSoftmax") or probabilities
            # rows that are one input's positions (a frame tagging) are read as one sequence
            kind = "argmax" if _rows_are_positions(proto, name, shape[0]) else "top1"
            decisions[name] = Decision(kind, gated=distribution or _named_as_classes(name)
                                       or _class_gap(values) >= CLASS_GAP, confident=kind == "top1" and probabilities)
        elif len(shape) == 3 and shape[-1] >= 2 and maker in ("Softmax", "LogSoftmax"):
            decisions[name] = Decision("argmax")
        elif len(shape) == 3 and shape[-1] >= 2 and maker != "Sigmoid" and (
                _named_as_classes(name) or _class_gap(values) >= CLASS_GAP):
            # raw scores per position (a frame tagger's, a token classifier's): the argmax per position
            decisions[name] = Decision("argmax")
        elif probability and (maker == "Sigmoid" or (maker == "Softmax" and len(shape) >= 3 and shape[1] == 1)):
            decisions[name] = Decision("map", MAP_THRESHOLD,
                                       ranked=maker == "Sigmoid" and len(shape) == 2 and shape[-1] >= RANKED_MIN_CLASSES)
    return decisions


# Ops whose output is a feature vector, never class scores: a transformer's hidden states end in a
# normalization, and their few outlier dimensions (a known trait of BERT-like models) lead every
# row by more than CLASS_GAP, so they were read as an argmax per token. Measured on a MiniLM and a
# BERT-like masked-sequence model from PyPI wheels: FP16 at cosine 0.9999997 was refused on that
# argmax (an unseen-model sweep).
_FEATURE_MAKERS = ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                   "SkipSimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization")

# Output names that say "class scores" (an exporter's or a framework's words): a raw [N, C] or
# [N, T, C] output so named is read by its argmax, however close its classes are (an untrained or
# unsure classifier's near ties are exactly what quantization flips).
_CLASS_WORDS = ("logit", "class", "score", "prob", "label", "tag", "pred")


def _named_as_classes(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _CLASS_WORDS)


def _decided(rows: np.ndarray) -> np.ndarray:
    """The rows whose largest value is unique: where the float model's top two are exactly equal
    (two Sigmoid scores saturated at 1.0 in float32) its argmax is the first index by convention,
    not a decision, and a candidate moving either by one step "flips" it."""
    if rows.shape[-1] < 2:
        return np.ones(rows.shape[0], bool)
    ordered = np.sort(rows, axis=-1)
    return ordered[:, -1] > ordered[:, -2]


def _pairs(reference: list[np.ndarray], candidate: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (float, candidate) outputs of each sample that can be compared (the candidate ran and
    has the float output's shape), as given: each is read in float64 one pair at a time (_as64). A
    recogniser's [1, 40, 18710] probabilities over 16 samples are 96 MB in float64; converted all
    at once, with their copies, they took quantize's process from 350 MB to 1,090 MB (bench/RESULTS.md,
    session 28)."""
    return [(r, c) for r, c in zip(reference, candidate) if c is not None and np.shape(r) == np.shape(c)]


def _as64(pairs: list[tuple[np.ndarray, np.ndarray]]):
    """Each pair in float64, one at a time."""
    for r, c in pairs:
        yield np.asarray(r, np.float64), np.asarray(c, np.float64)


def _decided_rows(pairs: list[tuple[np.ndarray, np.ndarray]]):
    """Per pair of class-score outputs (float, candidate), their rows as [rows, classes] where the
    float model decides (see _decided); pairs with fewer than two classes or no such row are left out."""
    for r, c in _as64(pairs):
        if r.ndim < 1 or r.shape[-1] < 2:
            continue
        rows, other = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
        decided = _decided(rows)
        if np.any(decided):
            yield rows[decided], other[decided]


def _class_gap(values: list[np.ndarray]) -> float:
    """The median over rows of (largest - second largest) / the row's standard deviation."""
    gaps = [lead for value in values for lead in _leads(value.reshape(-1, value.shape[-1]).astype(np.float64))]
    return float(np.median(gaps)) if gaps else 0.0


def agreement(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray]) -> float | None:
    """How far ``candidate``'s decisions agree with ``reference``'s, pooled over the samples
    (1.0: the same everywhere); None for ``cosine`` or when nothing can be compared."""
    pairs = _pairs(reference, candidate)
    if not pairs or decision.kind == "cosine":
        return None
    if decision.kind == "ctc":
        return ctc_agreement(decision, reference, candidate)
    if decision.kind in ("top1", "argmax"):
        same = total = 0
        for r, c in _as64(pairs):
            if r.ndim < 1 or r.shape[-1] < 2:
                continue
            rows, other = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
            decided = _decided(rows)
            a, b = np.argmax(rows[decided], axis=-1), np.argmax(other[decided], axis=-1)
            same += int(np.sum(a == b))
            total += a.size
        return same / total if total else None
    threshold = decision.threshold if decision.threshold is not None else MAP_THRESHOLD
    tp = fp = fn = 0
    for r, c in _as64(pairs):
        a, b = r > threshold, c > threshold
        tp += int(np.sum(a & b))
        fp += int(np.sum(~a & b))
        fn += int(np.sum(a & ~b))
    if tp + fp + fn == 0:
        return 1.0  # nothing above the threshold in either: the same (empty) decision
    return 2 * tp / (2 * tp + fp + fn)


def regions(mask: np.ndarray) -> np.ndarray:
    """The 8-connected regions of a 2-D boolean mask, as bounding boxes [K, 4] (first row, first
    column, last row, last column), in no particular order. Labelled by runs: each row's runs of
    True, joined to the runs they touch in the next row (union-find by repeated hooking)."""
    mask = np.asarray(mask, bool)
    height, width = mask.shape
    padded = np.zeros((height, width + 2), np.int8)
    padded[:, 1:-1] = mask
    step = np.diff(padded, axis=1)
    rows, starts = np.nonzero(step == 1)
    _, ends = np.nonzero(step == -1)  # one past each run's last column; row-major, so paired with starts
    runs = rows.size
    if runs == 0:
        return np.zeros((0, 4), np.int64)
    stride = width + 2
    start_keys, end_keys = rows * stride + starts, rows * stride + ends
    # the runs of the next row that touch run i (8-connected): they end at or after its start and
    # start at or before its end
    first = np.searchsorted(end_keys, (rows + 1) * stride + starts, side="left")
    last = np.searchsorted(start_keys, (rows + 1) * stride + ends, side="right")
    counts = np.maximum(last - first, 0)
    left = np.repeat(np.arange(runs), counts)
    right = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(first, counts)
    labels = np.arange(runs)
    while left.size:
        before = labels.copy()
        low = np.minimum(labels[left], labels[right])
        np.minimum.at(labels, labels[left], low)
        np.minimum.at(labels, labels[right], low)
        while True:  # every run points at its root
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped
        if np.array_equal(labels, before):
            break
    _, region = np.unique(labels, return_inverse=True)
    count = int(region.max()) + 1
    boxes = np.empty((count, 4), np.int64)
    boxes[:, :2] = np.iinfo(np.int64).max
    boxes[:, 2:] = -1
    np.minimum.at(boxes[:, 0], region, rows)
    np.minimum.at(boxes[:, 1], region, starts)
    np.maximum.at(boxes[:, 2], region, rows)
    np.maximum.at(boxes[:, 3], region, ends - 1)
    return boxes


def _spatial(value: np.ndarray) -> bool:
    """A map laid out as images: [N, C, H, W] (or more leading axes) with H, W >= 2. A rank-3
    output ([1, T, C] frame probabilities, [1, 84, 8400] detector rows) has no two spatial axes
    to box, and is judged by F1 alone."""
    return value.ndim >= 4 and value.shape[-1] >= 2 and value.shape[-2] >= 2


def region_agreement(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray]
                     ) -> dict[str, Any] | None:
    """How far the candidate keeps the map's regions: per level (``map:T``: T alone; inferred: each
    of MAP_LEVELS), the connected regions above it in each 2-D plane (the last two axes) of every
    sample, matched by their bounding boxes exactly: 2 * same / (regions of the float map + regions
    of the candidate's). The worst level's share is the agreement. None where the map has no two
    spatial axes (a per-frame or per-class probability) or nothing can be compared."""
    planes = [(r.reshape(-1, *r.shape[-2:]), c.reshape(-1, *c.shape[-2:]))
              for r, c in ((np.asarray(r), np.asarray(c)) for r, c in zip(reference, candidate) if c is not None)
              if r.shape == c.shape and _spatial(r)]
    pairs = [(r[k], c[k]) for r, c in planes for k in range(r.shape[0])]
    if not pairs:
        return None
    if len(pairs) > _REGION_PLANES:
        pairs = pairs[:: int(np.ceil(len(pairs) / _REGION_PLANES))]
    levels = (decision.threshold,) if decision.threshold_given and decision.threshold is not None else MAP_LEVELS
    shares: dict[float, float] = {}
    counts: dict[float, int] = {}
    boxes: dict[float, tuple[int, int]] = {}  # (kept, the float map's) per level
    for level in levels:
        same = total = floats = 0
        for r, c in pairs:
            boxes_r = [tuple(box) for box in regions(r > level)]
            boxes_c = [tuple(box) for box in regions(c > level)]
            kept = set(boxes_r) & set(boxes_c)
            # a box held by several regions (rare: nested ones) counts as often as both maps hold it
            same += sum(min(boxes_r.count(box), boxes_c.count(box)) for box in kept) if kept else 0
            total += len(boxes_r) + len(boxes_c)
            floats += len(boxes_r)
        shares[level] = 2 * same / total if total else 1.0
        counts[level] = total
        boxes[level] = (same, floats)
    worst = min(levels, key=lambda level: (shares[level], -counts[level]))
    return {"region_agreement": shares[worst], "region_level": worst,
            "region_levels": {f"{level:g}": round(share, 6) for level, share in shares.items()},
            "required_regions": REQUIRED_REGIONS, "regions_kept": boxes[worst][0], "regions": boxes[worst][1]}


# At most this many margins (and errors) enter the expected-agreement estimate (a detector's map
# has millions of elements; an even stride keeps the estimate's shape and its cost bounded).
_ESTIMATE_CAP = 200_000


def _thin(values: np.ndarray) -> np.ndarray:
    values = values[np.isfinite(values)]
    if values.size > _ESTIMATE_CAP:
        values = values[:: int(np.ceil(values.size / _ESTIMATE_CAP))]
    return values


# The margin the near-boundary line of _flip_rate reaches: the second smallest.
NEAREST_MARGINS = 2


def _flip_rate(margins: np.ndarray, errors: np.ndarray) -> float:
    """How often a decision changes on an input nobody measured: the chance that an error drawn
    from ``errors`` (how far the candidate moved a decision toward its boundary) exceeds a margin
    drawn from ``margins`` (how far the float model's decision sits from it). The margins' CDF is
    interpolated through the origin at plotting positions k / (n + 1), so that a few samples with
    no near tie among them still give a near-tie rate in proportion to the error (eight margins all
    above the largest error do not prove that none falls below it)."""
    margins, errors = _thin(np.asarray(margins, np.float64)), _thin(np.asarray(errors, np.float64))
    if margins.size == 0 or errors.size == 0:
        return 0.0
    count = margins.size + 1
    tied = int(np.sum(margins <= 0.0))  # a margin of 0 (an exact tie) is below any positive error
    ordered = np.sort(margins[margins > 0.0])
    floor = tied / count
    if ordered.size == 0:
        cdf = np.full(errors.shape, floor)
    else:
        # the CDF through (0, floor) and each margin's plotting position k / (n + 1); a repeated margin
        # rises from its first position to its last where it stands
        values = np.unique(ordered)
        first = (tied + np.searchsorted(ordered, values, side="left") + 1) / count
        last = (tied + np.searchsorted(ordered, values, side="right")) / count
        index = np.searchsorted(values, errors, side="left")  # the margins' values below each error
        inside = np.minimum(index, values.size - 1)
        left_x = np.where(index == 0, 0.0, values[np.maximum(index - 1, 0)])
        left_y = np.where(index == 0, floor, last[np.maximum(index - 1, 0)])
        right_x, right_y = values[inside], first[inside]
        width = np.where(right_x > left_x, right_x - left_x, 1.0)
        # beyond the largest margin every decision is within reach
        cdf = np.where(index >= values.size, 1.0, left_y + (errors - left_x) / width * (right_y - left_y))
        # Near the boundary the CDF is a straight line through the origin up to the second smallest
        # margin, not the smallest: the smallest of a few samples is the most variable of them, and
        # one sample that happens to sit at a tie would set the density there for every unseen
        # input; two samples near the boundary say that decisions sit there (where the two sit
        # close, the line is steeper than the one through the smallest alone). Measured on
        # ConvNeXt-tiny (the journey's corpus): a lead of 5e-5 among 24 samples (the 0.5% quantile
        # of 400 fresh inputs is 1.5e-3) made the estimate 98.6% for FP16 weights, which kept all
        # 400 decisions.
        k = min(ordered.size, NEAREST_MARGINS)
        reach = ordered[k - 1]
        at_reach = (tied + k) / count  # the k-th margin's position, whether or not it repeats the one before
        cdf = np.where(errors <= reach, floor + errors / reach * (at_reach - floor), cdf)
    # an error that does not move a decision toward its boundary flips none
    return float(np.mean(np.where(errors > 0.0, cdf, 0.0)))


def _leads(rows: np.ndarray) -> np.ndarray:
    """Each row's largest value's lead over the runner-up, in the row's standard deviations (0 for
    a row of equal values)."""
    spread = np.std(rows, axis=-1)
    return _raw_leads(rows) / np.where(spread > 0, spread, 1.0)


def _raw_leads(rows: np.ndarray) -> np.ndarray:
    """Each row's largest value's lead over the runner-up, in the output's units."""
    ordered = np.sort(rows, axis=-1)
    return ordered[:, -1] - ordered[:, -2]


# Class probabilities are compared in log space, down to this many nats under each row's largest
# (e^-16: about 1e-7, float32's resolution near 1).
LOG_SPAN = 16.0
# ... and no lower than this many steps of a quantized output's grid: rounding moves a value of k
# steps by up to 1/(2k) of itself, so below 16 steps (1/32, 0.03 nats) a runner-up's move in log
# space is the grid's, not the model's (QNN's fixed Softmax encoding is 1/65536: a direction
# classifier's saturated rows hold their runner-up within a few steps of 0).
GRID_STEPS = 16


def _probability_rows(values) -> bool:
    """True when every row of every value is a probability distribution (in [0, 1], summing to 1);
    values with no row of two or more classes are passed over, and at least one must remain.
    ``values``: any iterable, read one value at a time in float64."""
    seen = False
    for value in values:
        if np.ndim(value) < 1 or np.shape(value)[-1] < 2 or not np.size(value):
            continue
        v = np.asarray(value, np.float64)
        if not (float(np.min(v)) >= 0.0 and float(np.max(v)) <= 1.0 and bool(np.all(np.abs(np.sum(v, axis=-1) - 1.0) < 1e-3))):
            return False
        seen = True
    return seen


def _grid_floor(values: list[np.ndarray]) -> float:
    """GRID_STEPS times the step of the grid ``values`` lie on (a quantized output's: a uint8
    Softmax output holds only multiples of 1/256), so that what the grid's rounding moves is not
    read as the model's change; 0 where they lie on no grid (a float output)."""
    if not values:
        return 0.0
    # thinned in the values' own type, then read in float64 (exact: the same values as thinning them in float64)
    joined = np.concatenate([np.ravel(np.asarray(v)) for v in values])
    if not np.issubdtype(joined.dtype, np.floating):
        joined = joined.astype(np.float64)
    pooled = np.unique(_thin(joined).astype(np.float64))
    if len(pooled) < 3:
        return 0.0
    # the grid is read where float32 holds it best and where it matters: the bottom of the range
    # (a runner-up near 0), its hundredth, else its tenth, else all of it
    for share in (0.01, 0.1, 1.0):
        bottom = pooled[pooled <= pooled[0] + share * (pooled[-1] - pooled[0])]
        if len(bottom) >= 3:
            break
    pooled = bottom
    if len(pooled) < 3:
        return 0.0
    gaps = np.diff(pooled)[:1000]
    # a remainder below this is float32's rounding, not a step
    noise = 1e-6 * max(1e-3, float(np.max(np.abs(pooled))))
    step = float(gaps[0])
    for gap in gaps[1:]:  # Euclid's algorithm on the gaps, to within the rounding
        a, b = max(step, float(gap)), min(step, float(gap))
        while b > noise:
            a, b = b, a % b
            if a - b < noise:  # a remainder of almost a whole step is rounding too
                b = 0.0
        step = a
        if step <= noise:
            return 0.0
    units = (pooled - pooled[0]) / step
    if float(np.max(np.abs(units - np.round(units)))) > 0.05:
        return 0.0
    return GRID_STEPS * step


def _log_scores(rows: np.ndarray, step: float, other: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Probability rows (and a candidate's for the same inputs) as log probabilities, floored per
    row at the reference's largest value times e^-LOG_SPAN or at ``step`` (GRID_STEPS of a quantized
    output's steps), whichever is larger.

    A decision between classes is a ratio of their probabilities, and a model's error on it is of
    about the same size in log space on every row, while in probabilities a softmax squeezes it by
    p(1 - p): on saturated rows it vanishes, near a tie it is largest. Measured on magika's content
    model (bench/apps, int8 dynamic): over 24 files, errors in probabilities had a median of 1e-5,
    over 160 others 1.8e-3, 100 times larger; in log space 0.053 and 0.061. Estimated from the 24,
    probability space expected 99.9995% top-1 agreement, log space 99.92%; measured on 320 other
    files, 99.06%."""
    floor = np.maximum(np.max(rows, axis=-1, keepdims=True) * np.exp(-LOG_SPAN), step)
    floor = np.where(floor > 0, floor, np.finfo(np.float64).tiny)
    scaled = np.log(np.maximum(rows, floor))
    return scaled, (np.log(np.maximum(other, floor)) if other is not None else None)


def _usable(decision: Decision, reference: list[np.ndarray], more: list[np.ndarray] | None) -> list[np.ndarray]:
    """The float outputs of ``more`` whose margins can join ``reference``'s: for classes the class
    axis must match (sequences of other lengths count), a map any shape. As given (read in float64
    where used)."""
    if not reference:
        return []
    classes = np.shape(reference[0])[-1:]
    return [np.asarray(m) for m in (more or []) if m is not None and np.ndim(m) >= 1
            and (decision.kind == "map" or np.shape(m)[-1:] == classes)]


def expected_agreement(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray],
                       more: list[np.ndarray] | None = None) -> float | None:
    """The agreement to expect on unseen inputs of the same kind, from the float model's margins
    (how far each decision sits from its boundary: a class's lead over the runner-up, in the
    output's units, or in log probabilities where its rows are probabilities (see _log_scores); a
    map element's distance from the threshold) and the candidate's errors
    on them (how far it moved each toward the boundary), taken as independent. A gate held on a
    few samples passes a model whose decisions are near ties more often than its error is small:
    measured on the NPU journey, classes 0.002-0.004 apart and a VAD frame 0.003 from its
    threshold flipped on unseen samples after the gate's 8 held-back samples had agreed. ``more``:
    the float model's outputs on other samples (the calibration samples: the margins are the float
    model's alone, so every sample it ran on says how often decisions sit near their boundary, and
    eight held-back samples say it poorly). None for ``cosine`` or when nothing can be compared."""
    more = _usable(decision, reference, more)
    pairs = _pairs(reference, candidate)
    if not pairs or decision.kind == "cosine":
        return None
    if decision.kind == "ctc":
        return expected_ctc_agreement(decision, reference, candidate, more)[1]
    if decision.kind in ("top1", "argmax"):
        margins, errors = [], []
        in_log = _probability_rows(r for r, _ in pairs)
        step = _grid_floor([c for _, c in pairs]) if in_log else 0.0
        for rows, other in _decided_rows(pairs):
            if in_log:
                rows, other = _log_scores(rows, step, other)
            lead = np.argmax(rows, axis=-1)
            index = np.arange(rows.shape[0])

            def lead_over_rest(values: np.ndarray) -> np.ndarray:
                rest = values.copy()
                rest[index, lead] = -np.inf
                return values[index, lead] - np.max(rest, axis=-1)

            # in the output's own units, the same for every row: a lead in each row's standard
            # deviations is 2 in every row of two classes, however near the tie (measured on the
            # NPU journey: PP-OCR's direction classifier, probabilities 0.51/0.49 and 0.99/0.01 both
            # at margin 2, expected 99.84% agreement while an unseen sample at 0.62 flipped)
            float_lead = lead_over_rest(rows)
            margins.append(float_lead)
            errors.append(float_lead - lead_over_rest(other))
        if not margins:
            return None
        for m in more:  # one at a time, in float64
            if m.ndim < 1 or m.shape[-1] < 2:
                continue
            rows = np.asarray(m, np.float64).reshape(-1, m.shape[-1])
            if in_log:
                if not _probability_rows([rows]):
                    continue
                rows = _log_scores(rows, step)[0]
            lead = _raw_leads(rows)
            margins.append(lead[lead > 0])
        return 1.0 - _flip_rate(np.concatenate(margins), np.concatenate(errors))
    threshold = decision.threshold if decision.threshold is not None else MAP_THRESHOLD
    reference_values = np.concatenate([np.asarray(r, np.float64).ravel() for r, _ in pairs])
    candidate_values = np.concatenate([np.asarray(c, np.float64).ravel() for _, c in pairs])
    above = reference_values > threshold
    pooled = (np.concatenate([reference_values] + [np.asarray(m, np.float64).ravel() for m in more]) if more
              else reference_values)
    pooled_above = pooled > threshold
    positives, negatives = int(np.sum(pooled_above)), int(np.sum(~pooled_above))
    if positives == 0:
        return 1.0
    moved = candidate_values - reference_values
    missed = positives * _flip_rate(pooled[pooled_above] - threshold, -moved[above])
    added = negatives * _flip_rate(threshold - pooled[~pooled_above], moved[~above]) if negatives else 0.0
    kept = positives - missed
    return float(2 * kept / (2 * kept + missed + added))


def _as_sequences(value: np.ndarray) -> np.ndarray:
    """The argmax of an [N, T, C] output as rows of T positions. A time-major [T, N, C] output (a
    CRNN's, ddddocr's: [25, 1, 8210]) is told by its batch axis of 1 in the middle."""
    tags = np.argmax(value, axis=-1)
    if tags.ndim == 2 and tags.shape[1] == 1 and tags.shape[0] > 1:
        tags = tags.T
    return tags.reshape(-1, tags.shape[-1])


def sequence_agreement(reference: list[np.ndarray], candidate: list[np.ndarray]) -> float | None:
    """The share of sequences (the rows of an [N, T, C] output, over the samples) whose argmax is
    the same at every position."""
    same = total = 0
    for r, c in zip(reference, candidate):
        r, c = np.asarray(r), np.asarray(c) if c is not None else None
        if c is None or r.shape != c.shape or r.ndim < 2 or r.shape[-1] < 2:
            continue
        a, b = _as_sequences(r), _as_sequences(c)
        same += int(np.sum(np.all(a == b, axis=-1)))
        total += a.shape[0]
    return same / total if total else None


def expected_sequence_agreement(reference: list[np.ndarray], per_position: float | None) -> float | None:
    """Whole sequences equal on unseen inputs, from the expected agreement per position: positions
    taken as independent, (agreement per position) ** (positions per sequence)."""
    lengths = [_as_sequences(np.asarray(r)).shape[-1] for r in reference if np.ndim(r) >= 2 and np.shape(r)[-1] >= 2]
    if per_position is None or not lengths:
        return None
    return float(per_position ** float(np.mean(lengths)))


def _top_probabilities(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The float model's top class's probability in each decided row, and the candidate's
    probability of that same class."""
    tops, theirs = [], []
    for rows, other in _decided_rows(pairs):
        lead = np.argmax(rows, axis=-1)
        index = np.arange(rows.shape[0])
        tops.append(rows[index, lead])
        theirs.append(other[index, lead])
    if not tops:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(tops), np.concatenate(theirs)


def confidence_agreement(reference: list[np.ndarray], candidate: list[np.ndarray],
                         more: list[np.ndarray] | None = None) -> dict[str, Any] | None:
    """The top class's probability held at each of MAP_LEVELS: per level, the share of rows on the
    same side of it (the float model's top class, its probability in both models) and the share
    to expect on unseen inputs, from margins and errors in probabilities, as a map's elements are
    judged. (In log-odds, a probability near 1 moves by many units where float32's or a grid's
    rounding moves it: measured on PP-OCR's direction classifier in A16W8 on synthetic lines, 78.7%
    expected at 0.9 where 94.3% of 600 fresh lines kept their side; in probabilities 87.5%.) The
    worst level is reported; None when no row decides."""
    ours, theirs = _top_probabilities(_pairs(reference, candidate))
    if ours.size == 0:
        return None
    pooled = [ours]
    for m in more or []:
        m = np.asarray(m, np.float64)
        if m.ndim >= 1 and m.shape[-1] >= 2 and _probability_rows([m]):
            pooled.append(_top_probabilities([(m, m)])[0])
    return held_at_levels(ours, theirs, np.concatenate(pooled), REQUIRED["top1"])


def held_at_levels(ours: np.ndarray, theirs: np.ndarray, everything: np.ndarray, required: float) -> dict[str, Any]:
    """Scores in 0..1 (``ours`` the float model's, ``theirs`` the candidate's for the same rows)
    held at each of MAP_LEVELS: per level, the share on the same side of it, and the share to
    expect from the float scores' distances to it (``everything``: ours and those of other
    samples) and the candidate's moves toward it; the worst level, with ``passed`` against
    ``required``."""
    worst: dict[str, Any] | None = None
    for level in MAP_LEVELS:
        above = ours > level
        agreed = float(np.mean(above == (theirs > level)))
        # each error as a move toward the level, each margin the float value's distance from it
        errors = np.where(above, ours - theirs, theirs - ours)
        expected = 1.0 - _flip_rate(np.abs(everything - level), errors)
        entry = {"level": level, "agreement": agreed, "expected_agreement": expected}
        if worst is None or min(agreed, expected) < min(worst["agreement"], worst["expected_agreement"]):
            worst = entry
    worst["required"] = required
    worst["passed"] = bool(worst["agreement"] >= required and worst["expected_agreement"] >= required)
    return worst


def detector_rows(value: np.ndarray) -> np.ndarray | None:
    """A YOLO-style detector output as [4 + C, N] (rows: box centre x, y, width, height, then a
    score per class; the axis of fewer entries is the rows'); None for another layout."""
    array = np.asarray(value, np.float64)
    if array.ndim < 2 or int(np.prod(array.shape[:-2])) != 1:
        return None
    rows = array.reshape(array.shape[-2:])
    if rows.shape[0] > rows.shape[1]:
        rows = rows.T
    return rows if rows.shape[0] >= 5 else None


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one (cx, cy, w, h) box with each of ``others`` ([K, 4])."""
    def corners(b):
        return b[..., 0] - b[..., 2] / 2, b[..., 1] - b[..., 3] / 2, b[..., 0] + b[..., 2] / 2, b[..., 1] + b[..., 3] / 2
    ax1, ay1, ax2, ay2 = corners(box)
    bx1, by1, bx2, by2 = corners(others)
    inter = np.clip(np.minimum(ax2, bx2) - np.maximum(ax1, bx1), 0, None) * np.clip(
        np.minimum(ay2, by2) - np.maximum(ay1, by1), 0, None)
    union = np.abs(box[2] * box[3]) + np.abs(others[:, 2] * others[:, 3]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _nms(rows: np.ndarray, threshold: float) -> list[int]:
    """The anchors a detector's application keeps from [4 + C, N] rows: those whose best class
    score reaches ``threshold``, highest first, each kept unless it overlaps a kept one by more than
    DETECT_NMS_IOU (class-agnostic, as NudeNet's cv2.dnn.NMSBoxes)."""
    best = rows[4:].max(axis=0)
    order = [int(i) for i in np.argsort(-best) if best[i] >= threshold]
    kept: list[int] = []
    for index in order:
        if not kept or np.all(_iou(rows[:4, index], rows[:4, kept].T) <= DETECT_NMS_IOU):
            kept.append(index)
    return kept


def detections(rows: np.ndarray, threshold: float) -> list[tuple[int, np.ndarray]]:
    """(class, box) of a detector's [4 + C, N] rows after non-maximum suppression (_nms)."""
    return [(int(rows[4:, i].argmax()), rows[:4, i]) for i in _nms(rows, threshold)]


def _logits(scores: np.ndarray) -> np.ndarray:
    clipped = np.clip(np.asarray(scores, np.float64), _LOGIT_CLIP, 1.0 - _LOGIT_CLIP)
    return np.log(clipped / (1.0 - clipped))


def _scene_margin(rows: np.ndarray, threshold: float, level: float) -> float | None:
    """How near a float scene is to changing: its anchors' best class scores' nearest distance to
    ``threshold``, as logits, leaving out the anchors a kept detection suppresses (one of those
    crossing T changes nothing unless the detection over it is lost, which that one's own margin
    counts)."""
    if rows.shape[0] <= 4 or rows.shape[1] == 0:  # no class scores, or no anchors
        return None
    best = rows[4:].max(axis=0)
    counted = np.ones(best.size, bool)
    for index in _nms(rows, threshold):
        counted &= ~((_iou(rows[:4, index], rows[:4].T) > DETECT_NMS_IOU) & (best < best[index]))
    return float(np.min(np.abs(_logits(best[counted]) - level)))


def expected_scene_agreement(threshold: float, reference: list[np.ndarray], candidate: list[np.ndarray | None],
                             more: list[np.ndarray]) -> float | None:
    """The share of unseen scenes whose detections a candidate keeps, each scene one decision (see
    REQUIRED_SCENES): the margins are each float scene's (_scene_margin, over ``reference`` and
    ``more``, [4 + C, N] rows), the errors the candidate's moves (either way) of the anchors' best
    class scores near ``threshold``, both as logits; a score the candidate makes NaN or infinite
    counts as moved past any margin. None where no candidate was compared, or fewer than
    DETECT_MIN_SCENES float scenes give margins."""
    level = float(_logits(np.array([threshold]))[0])
    margins = [m for m in (_scene_margin(rows, threshold, level) for rows in [*reference, *more]) if m is not None]
    if len(margins) < DETECT_MIN_SCENES:
        return None
    distances: list[np.ndarray] = []
    errors: list[np.ndarray] = []
    for rows, other in zip(reference, candidate):
        if other is None or other.shape != rows.shape or rows.shape[0] <= 4 or rows.shape[1] == 0:
            continue
        ours, theirs = _logits(rows[4:].max(axis=0)), other[4:].max(axis=0)
        distances.append(np.abs(ours - level))
        errors.append(np.where(np.isfinite(theirs), np.abs(_logits(theirs) - ours), _UNREAD_MOVE))
    if not errors:
        return None
    # the scores near T over every sample compared; the nearest DETECT_NEAREST where fewer lie in
    # the band (a score far below T is mostly output rounding, which its logit magnifies)
    distance, error = np.concatenate(distances), np.concatenate(errors)
    near = np.flatnonzero(distance <= DETECT_LOGIT_BAND)
    if near.size < DETECT_NEAREST:
        near = np.argsort(distance, kind="stable")[:DETECT_NEAREST]
    return 1.0 - _flip_rate(np.array(margins), error[near])


def _judge_detections(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray],
                      more: list[np.ndarray] | None) -> dict[str, Any]:
    """``detect:T``: the detections after NMS, matched by class and IoU >= DETECT_MATCH_IOU (F1),
    the matched ones' boxes held to DETECT_BOX_SLACK, the agreement to expect from the class scores
    judged as ``map:T``, and whole scenes, seen and expected (REQUIRED_SCENES)."""
    threshold = decision.threshold if decision.threshold is not None else DETECT_THRESHOLD
    ref_rows = [detector_rows(r) for r in reference]
    cand_rows = [detector_rows(c) if c is not None else None for c in candidate]
    if not ref_rows or any(r is None for r in ref_rows):
        return {**decision.record(), "agreement": None, "expected_agreement": None, "passed": False if decision.gated
                else None, "error": "not a detector output ([1, 4 + C, N] or [1, N, 4 + C])"}
    scores = Decision("map", threshold, decision.chosen_by, decision.gated, threshold_given=True)
    more_rows = [detector_rows(m) for m in more or []]
    record = judge_decision(scores, [r[4:].ravel() for r in ref_rows],
                            [c[4:].ravel() if c is not None and c.shape == r.shape else None
                             for r, c in zip(ref_rows, cand_rows)],
                            [m[4:].ravel() for m in more_rows if m is not None])
    record.update(decision.record())
    matched = missed = added = held = compared = scenes_kept = 0
    for r, c in zip(ref_rows, cand_rows):
        if c is None or c.shape != r.shape:
            continue
        compared += 1
        want, got = detections(r, threshold), detections(c, threshold)
        free = list(range(len(got)))
        changed = False
        for cls, box in want:
            same = [j for j in free if got[j][0] == cls]
            overlaps = _iou(box, np.array([got[j][1] for j in same])) if same else np.array([])
            if same and overlaps.max() >= DETECT_MATCH_IOU:
                j = same[int(overlaps.argmax())]
                free.remove(j)
                matched += 1
                kept = bool(np.max(np.abs(box - got[j][1])) <= DETECT_BOX_SLACK)
                held += int(kept)
                changed = changed or not kept
            else:
                missed += 1
                changed = True
        added += len(free)
        scenes_kept += int(not changed and not free)
    agreed = (1.0 if matched + missed + added == 0 else 2 * matched / (2 * matched + missed + added)) if compared else None
    boxes = held / matched if matched else None
    scenes = scenes_kept / compared if compared else None
    scenes_expected = expected_scene_agreement(threshold, ref_rows, cand_rows, [m for m in more_rows if m is not None])
    record.update(agreement=agreed, detections_kept=matched, detections_lost=missed, detections_added=added,
                  box_agreement=boxes, box_slack=DETECT_BOX_SLACK, required_regions=REQUIRED_REGIONS,
                  scene_agreement=scenes, expected_scene_agreement=scenes_expected, required_scenes=REQUIRED_SCENES)
    expected = record.get("expected_agreement")
    passed = agreed is not None and agreed >= REQUIRED["detect"] and (expected is None or expected >= REQUIRED["detect"]) \
        and (boxes is None or boxes >= REQUIRED_REGIONS) \
        and all(value is None or value >= REQUIRED_SCENES for value in (scenes, scenes_expected))
    record["passed"] = passed if decision.gated else None
    return record


def dfl_distances(value: np.ndarray, bins: int | None = None) -> np.ndarray | None:
    """A DFL box head's output decoded as its application decodes it: [positions, 4] expected
    distances in bins (the softmax over each side's bins times 0..bins-1). The 4 x bins values lie
    on the last axis ([..., N, 4 x bins]) or on the one before it ([..., 4 x bins, N]): the one
    that holds 4 x bins, or, bins not given, the smaller of those holding a multiple of 4 (at least
    8); None where neither does."""
    array = np.asarray(value, np.float64)
    if array.ndim < 1:
        return None

    def fits(size: int) -> bool:
        return size == 4 * bins if bins else size >= 8 and size % 4 == 0

    axes = [axis for axis in (-1, -2) if array.ndim >= -axis and fits(array.shape[axis])]
    if not axes:
        return None
    axis = min(axes, key=lambda a: array.shape[a])  # (positions outnumber a side's bins)
    sides = np.moveaxis(array, axis, -1).reshape(-1, array.shape[axis])
    per_side = sides.shape[-1] // 4
    logits = sides.reshape(-1, 4, per_side)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ np.arange(per_side, dtype=np.float64)


def dfl_hint(name: str, shape: tuple[int, ...], metrics: dict[str, str] | None = None) -> str:
    """A refusal's hint where an output has the form of a DFL box head (an axis of 4 x bins
    values, 4 to 32 bins, smaller than the axis of positions beside it) and no --metric was given
    for it: its logits are not what an application reads. Only a hint: ``dfl`` is never inferred
    (a 32-channel feature map has the same form)."""
    if (metrics or {}).get(name) or len(shape) < 2:
        return ""
    for axis, other in ((-1, -2), (-2, -1)):
        size = shape[axis]
        if size % 4 == 0 and 4 <= size // 4 <= 32 and shape[other] > size:
            return (f"; if '{name}' is a DFL box head (4 sides x {size // 4} bins, decoded by a softmax), "
                    f"--metric {name}=dfl judges the distances its application decodes")
    return ""


def _judge_dfl(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict[str, Any]:
    """``dfl[:BINS]``: each box side's decoded distance (:func:`dfl_distances`), pooled over the
    samples: the share within DFL_SLACK bins of the float model's reaches REQUIRED["dfl"], and no
    side moves beyond DFL_LIMIT."""
    record: dict[str, Any] = {**decision.record(), "agreement": None, "expected_agreement": None}
    moved = []
    for r, c in zip(reference, candidate):
        ours = dfl_distances(r, decision.bins)
        if ours is None:
            record.update(passed=False if decision.gated else None,
                          error=f"not a DFL box output (an axis of 4 x bins values): shape {list(np.shape(r))}")
            return record
        theirs = dfl_distances(c, decision.bins) if c is not None and np.shape(c) == np.shape(r) else None
        if theirs is not None:
            moved.append(np.abs(theirs - ours).ravel())
    if not moved:
        record["passed"] = False if decision.gated else None
        return record
    every = np.concatenate(moved)
    finite = np.isfinite(every)  # a NaN side is a side moved
    agreed = float(np.mean(finite & (every <= DFL_SLACK))) if every.size else 1.0
    largest = float(every[finite].max()) if finite.any() else None
    record.update(agreement=agreed, sides=int(every.size), largest_move_bins=largest)
    passed = agreed >= REQUIRED["dfl"] and bool(finite.all()) and (largest is None or largest <= DFL_LIMIT)
    record["passed"] = passed if decision.gated else None
    return record


def _sequence_scores(value: np.ndarray) -> np.ndarray:
    """An [N, T, C] output (or a time-major [T, 1, C], as _as_sequences tells it) as [N, T, C]."""
    array = np.asarray(value, np.float64)
    if array.ndim == 3 and array.shape[1] == 1 and array.shape[0] > 1:
        array = np.transpose(array, (1, 0, 2))
    return array.reshape(-1, *array.shape[-2:]) if array.ndim >= 2 else array.reshape(1, 1, -1)


def ctc_strings(value: np.ndarray, blank: int = CTC_BLANK) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Greedy CTC decoding of each sequence of ``value``: (the class indices kept, the positions
    they were read at): the argmax per position, repeats merged, the blank dropped."""
    scores = _sequence_scores(value)
    classes = scores.shape[-1]
    blank = blank % classes if classes else 0
    decoded = []
    for row in np.argmax(scores, axis=-1):
        keep = np.ones(row.size, bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank
        decoded.append((tuple(int(i) for i in row[keep]), np.nonzero(keep)[0]))
    return decoded


def _line_scores(value: np.ndarray, blank: int) -> list[float | None]:
    """Each decoded line's score as PaddleOCR-style recognisers report it: the mean of the top
    probability over the positions it keeps; None for an empty line."""
    scores = _sequence_scores(value)
    lines = []
    for (_, kept), row in zip(ctc_strings(value, blank), scores):
        lines.append(float(np.mean(np.max(row[kept], axis=-1))) if kept.size else None)
    return lines


def _ctc_pairs(reference: list[np.ndarray], candidate: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.asarray(r), np.asarray(c)) for r, c in zip(reference, candidate)
            if c is not None and np.shape(r) == np.shape(c) and np.ndim(r) >= 2 and np.shape(r)[-1] >= 2]


def ctc_agreement(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray]) -> float | None:
    """The share of decoded strings (over the samples' sequences) that are equal."""
    same = total = 0
    for r, c in _ctc_pairs(reference, candidate):
        for (want, _), (got, _) in zip(ctc_strings(r, decision.blank), ctc_strings(c, decision.blank)):
            same += want == got
            total += 1
    return same / total if total else None


def expected_ctc_agreement(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray],
                           more: list[np.ndarray] | None = None) -> tuple[float | None, float | None]:
    """(the agreement per position to expect on unseen inputs, the strings' from it): every
    position's argmax taken as able to change a string, so the strings' figure is cautious (a
    repeat turning blank at its run's edge changes nothing; see CTC_REPLACES_COSINE)."""
    per_position = expected_agreement(Decision("argmax"), reference, candidate, more)
    return per_position, expected_sequence_agreement(reference, per_position)


def _ctc_confidence(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray],
                    more: list[np.ndarray] | None) -> dict[str, Any] | None:
    """The lines' scores (see _line_scores) held at each of MAP_LEVELS, as a top-1 class's
    probability is (confidence_agreement): a recogniser's application drops a line below a score
    of its own (rapidocr: text_score 0.5), and ortprep is not told it. Per level, the share of lines
    on the same side of it, and the share to expect from the float lines' distances to it (those
    of ``more`` too) and the candidate's moves; the worst level, held to REQUIRED["ctc"]. None
    where the output is not probabilities or no line is read."""
    pairs = _ctc_pairs(reference, candidate)
    if not pairs or not _probability_rows(_sequence_scores(r).reshape(-1, r.shape[-1]) for r, _ in pairs):
        return None
    ours, theirs = [], []
    for r, c in pairs:
        for want, got in zip(_line_scores(r, decision.blank), _line_scores(c, decision.blank)):
            if want is not None:
                ours.append(want)
                theirs.append(got if got is not None else 0.0)  # an emptied line has no score to keep
    if not ours:
        return None
    ours_a, theirs_a = np.asarray(ours), np.asarray(theirs)
    pooled = [ours_a]
    for m in more or []:
        m = np.asarray(m)
        if np.ndim(m) >= 2 and np.shape(m)[-1] == np.shape(pairs[0][0])[-1]:
            pooled.append(np.asarray([v for v in _line_scores(m, decision.blank) if v is not None]))
    return {**held_at_levels(ours_a, theirs_a, np.concatenate(pooled), REQUIRED["ctc"]), "lines": int(ours_a.size)}


def _judge_ctc(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray],
               more: list[np.ndarray] | None) -> dict[str, Any]:
    """``ctc``: the decoded strings equal on at least REQUIRED["ctc"] of the samples' sequences, as
    many to expect on unseen inputs (cautious: from the positions' margins), and the lines' scores
    on the same side of each level (_ctc_confidence, for probabilities)."""
    record: dict[str, Any] = {**decision.record()}
    agreed = ctc_agreement(decision, reference, candidate)
    per_position, expected = expected_ctc_agreement(decision, reference, candidate, more)
    strings = sum(_sequence_scores(r).shape[0] for r, _ in _ctc_pairs(reference, candidate))
    record.update(agreement=agreed, expected_agreement=expected, strings=strings,
                  strings_changed=None if agreed is None else int(round(strings * (1.0 - agreed))),
                  position_agreement=agreement(Decision("argmax"), reference, candidate),
                  expected_position_agreement=per_position)
    usable = _usable(decision, reference, more)  # read one at a time (_line_scores, in float64)
    if usable:
        record["margin_samples"] = len(reference) + len(usable)
    required = REQUIRED["ctc"]
    passed = agreed is not None and agreed >= required and (expected is None or expected >= required)
    confidence = _ctc_confidence(decision, reference, candidate, usable)
    if confidence is not None:
        record["confidence"] = confidence
        passed = passed and confidence["passed"]
    if agreed is None:
        record["error"] = "no [N, T, C] or [T, 1, C] scores with C >= 2 to decode"
    record["passed"] = passed if decision.gated else None
    return record


def judge_decision(decision: Decision, reference: list[np.ndarray], candidate: list[np.ndarray],
                   more: list[np.ndarray] | None = None) -> dict[str, Any]:
    """One output's decision held to the gate, as quantize's gate and load/compile's tolerance both
    hold it: the agreement on the samples and the agreement to expect on unseen ones reach
    REQUIRED; an ``argmax`` is also read as whole sequences (observed and expected reach
    REQUIRED_SEQUENCES); a ``map`` with two spatial axes also by its regions' boxes (the share of
    region_agreement reaches REQUIRED_REGIONS). ``more``: the float model's outputs on other
    samples, whose margins join the estimate (expected_agreement). The record's ``passed`` is None
    when the decision is not gated. ``detect``: see _judge_detections."""
    if decision.kind == "detect":
        return _judge_detections(decision, reference, candidate, more)
    if decision.kind == "dfl":
        return _judge_dfl(decision, reference, candidate)
    if decision.kind == "ctc":
        return _judge_ctc(decision, reference, candidate, more)
    agreed = agreement(decision, reference, candidate)
    expected = expected_agreement(decision, reference, candidate, more)
    record: dict[str, Any] = {**decision.record(), "agreement": agreed, "expected_agreement": expected}
    usable = _usable(decision, reference, more)
    if usable:
        record["margin_samples"] = len(reference) + len(usable)
    if decision.kind == "cosine":
        record["passed"] = None
        return record
    passed = agreed is not None and agreed >= REQUIRED[decision.kind] and (expected is None or expected >= REQUIRED[decision.kind])
    if decision.kind == "argmax":
        whole = sequence_agreement(reference, candidate)
        whole_expected = expected_sequence_agreement(reference, expected)
        record.update(sequence_agreement=whole, expected_sequence_agreement=whole_expected,
                      required_sequences=REQUIRED_SEQUENCES)
        passed = passed and all(value is None or value >= REQUIRED_SEQUENCES for value in (whole, whole_expected))
    if decision.kind == "map":
        kept = region_agreement(decision, reference, candidate)
        if kept is not None:
            record.update(kept)
            passed = passed and kept["region_agreement"] >= REQUIRED_REGIONS
        if decision.ranked:  # the rows' best-scored class, held as a top-1 decision is
            best = judge_decision(Decision("top1", chosen_by=decision.chosen_by), reference, candidate, more)
            # no row with a unique best score (every row a tie): nothing ranked to keep
            ranking_passed = best["agreement"] is None or bool(best["passed"])
            record["ranking"] = {"agreement": best["agreement"], "expected_agreement": best["expected_agreement"],
                                 "required": best["required"], "passed": ranking_passed}
            passed = passed and ranking_passed
    if decision.kind == "top1" and decision.confident:
        confidence = confidence_agreement(reference, candidate, more)
        if confidence is not None:
            record["confidence"] = confidence
            passed = passed and confidence["passed"]
    record["passed"] = passed if decision.gated else None
    return record


def with_margin(required: float) -> float:
    """A share the gate asks, raised half-way to 1: what a result chosen among several trials on
    the same samples must hold (the cosine's margin is search.margin_aim, the same rule)."""
    return required + (1.0 - required) / 2


def share_gaps(record: dict[str, Any], bar=lambda required: required) -> list[tuple[str, float, float]]:
    """(what, asked, measured) for each share the gate asks of a judged decision (``bar(required)``)
    and the share measured or expected: agreement, whole sequences, regions, whole scenes, the
    ranking, the confidence."""
    gaps: list[tuple[str, float, float]] = []

    def gap(required: float | None, *values: tuple[str, float | None]) -> None:
        if required is not None:
            gaps.extend((what, bar(required), value) for what, value in values if value is not None)

    gap(record.get("required"), ("agreement", record.get("agreement")),
        ("expected agreement", record.get("expected_agreement")))
    gap(record.get("required_sequences"), ("whole sequences", record.get("sequence_agreement")),
        ("expected whole sequences", record.get("expected_sequence_agreement")))
    gap(record.get("required_regions"), ("regions", record.get("region_agreement")),
        ("boxes", record.get("box_agreement")))
    gap(record.get("required_scenes"), ("whole scenes", record.get("scene_agreement")),
        ("expected whole scenes", record.get("expected_scene_agreement")))
    for part in ("ranking", "confidence"):
        nested = record.get(part) or {}
        gap(nested.get("required"), (part, nested.get("agreement")), (f"expected {part}", nested.get("expected_agreement")))
    return gaps


def decision_shortfall(record: dict[str, Any] | None) -> float:
    """How far a judged decision (judge_decision's record) falls short of the gate: the largest gap
    between a share the gate asks for and the share measured or expected (agreement, whole
    sequences, regions, whole scenes, the ranking, the confidence), in share points; 0.0 when it passes, is not
    gated, or has nothing measured. The accuracy search reads it as progress where the outputs'
    cosine is already near 1 and the gate fails on the decision alone."""
    if not record or record.get("passed") is not False:
        return 0.0
    return max([0.0, *(asked - value for _, asked, value in share_gaps(record))])


def margin_shortfall(record: dict[str, Any] | None) -> float:
    """How far a gated decision falls short of every share the gate asks raised half-way to 1
    (with_margin), in share points; 0.0 when it holds them all, is not gated, or has nothing
    measured. A result chosen among trials judged on the same samples is the one those samples
    favour (the winner's curse): measured in session 29, ddddocr's dynamic int8 kept after 42
    nodes were kept float read 23 of 24 strings (95.8%, 96.8% expected, the gate asks 95%) and 94
    of 100 fresh lines (bench/RESULTS.md, "Session 30: the decision margin of a chosen result")."""
    if not record or record.get("passed") is None:  # not gated
        return 0.0
    return max([0.0, *(asked - value for _, asked, value in share_gaps(record, with_margin))])
