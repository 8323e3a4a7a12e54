"""RapidOCR (PP-OCR on ONNX Runtime): the text it reads from a page.

The app: ``RapidOCR()(image)`` with its shipped configuration: the PP-OCRv6 small detector
(resized so the short side is 736), the PP-OCR mobile direction classifier (crops 48x192, batches
of 6, rotates a crop when it says "180" with score >= 0.9), the PP-OCRv6 small recogniser (crops
48 high, batches of 6 sorted by width, its character list read from the model's metadata).
Its answer: boxes, strings and scores, top to bottom. One model is swapped at a time; the other
two stay float.

Inputs: document crops from bench/realistic.py (lines of a 5x7 dot font in varying sizes, ink and
paper, blur and noise), 240-400 x 320-560 pixels, BGR uint8 as a user passes them; every third
one upside down (so the classifier has something to do). Calibration: 24 pages from their own
seed; development and evaluation: 72 pages from another seed, even positions development, odd
positions evaluation. Metric: character error rate of the page's text (lines joined in the app's
order) against the float pipeline's: edit distance summed over pages / characters of the float
text; and the share of float boxes that a box of the candidate overlaps with IoU >= 0.5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.referee import edit_distance, iou_corners

PACKAGES = ["rapidocr"]
METRIC = "CER vs float"
BOUND = ("max", 1.0)  # % character error rate against the float pipeline
CALIBRATION, DEV_EVAL = 24, 72


def shipped_models() -> dict[str, str]:
    import importlib.util

    models = Path(importlib.util.find_spec("rapidocr").origin).parent / "models"
    return {"ocr_det": str(models / "PP-OCRv6_det_small.onnx"),
            "ocr_cls": str(models / "ch_ppocr_mobile_v2.0_cls_mobile.onnx"),
            "ocr_rec": str(models / "PP-OCRv6_rec_small.onnx")}


def page(rng: np.random.Generator, index: int) -> np.ndarray:
    from bench import realistic

    height, width = int(rng.integers(240, 401)), int(rng.integers(320, 561))
    image = realistic.page(rng, height, width)  # (3, H, W) RGB, 0..255
    if index % 3 == 2:
        image = image[:, ::-1, ::-1]
    return np.ascontiguousarray(image.transpose(1, 2, 0)[:, :, ::-1]).round().astype(np.uint8)


def inputs(split: str) -> list[np.ndarray]:
    if split == "calib":
        rng = np.random.default_rng(2001)
        return [page(rng, i) for i in range(CALIBRATION)]
    rng = np.random.default_rng(2002)
    items = [page(rng, i) for i in range(DEV_EVAL)]
    return items[0::2] if split == "dev" else items[1::2]


def build():
    from rapidocr import RapidOCR

    return RapidOCR(params={"Global.log_level": "error"})


def answer(app, image: np.ndarray) -> dict:
    result = app(image)
    if result.txts is None:
        return {"boxes": [], "txts": [], "scores": []}
    return {"boxes": np.asarray(result.boxes).round(1).tolist(), "txts": list(result.txts),
            "scores": [round(float(s), 4) for s in result.scores]}


def score(reference: list[dict], candidate: list[dict], key: str | None = None) -> dict:
    """CER (%) of the candidate's page text against the float pipeline's, and box match (%)."""
    edits = chars = boxes = matched = pages_changed = 0
    for a, b in zip(reference, candidate):
        text = "\n".join(a["txts"])
        other = "\n".join(b.get("txts", [])) if "error" not in b else ""
        edits += edit_distance(text, other)
        chars += len(text)
        pages_changed += text != other
        boxes += len(a["boxes"])
        matched += sum(any(iou_corners(x, y) >= 0.5 for y in b.get("boxes", [])) for x in a["boxes"])
    return {"value": 100.0 * edits / max(1, chars), "n": len(reference),
            "detail": f"boxes matched {100.0 * matched / max(1, boxes):.1f}%, pages changed {pages_changed}",
            "chars": chars}
