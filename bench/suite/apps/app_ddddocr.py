"""ddddocr (captcha OCR): the string it reads from a captcha image.

The app: ``DdddOcr(show_ad=False).classification(png_bytes)``, which loads common_old.onnx (the
default model; it ships partly int8, with DynamicQuantizeLinear/DynamicQuantizeLSTM), and
``DdddOcr(beta=True, show_ad=False)`` which loads common.onnx. Both resize the image to 64 pixels
high (width by aspect), grayscale, scale to 0..1, and decode the CTC output against the charset
the package ships. Its answer: the string.

Inputs: captcha-like PNGs drawn here with Pillow's built-in scalable font: 4-6 characters from
a-z and 0-9, each at its own size, offset and rotation, on a tinted background with interference
lines, arcs and speckle noise; 120-200 x 40-70 pixels. Calibration: 32 images from their own seed;
development and evaluation: 120 images from another seed, even positions development, odd
positions evaluation. Metric: the share of images whose string equals the float model's.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from bench.referee import percent_equal

PACKAGES = ["ddddocr"]
METRIC = "string agreement"
BOUND = ("min", 95.0)
CALIBRATION, DEV_EVAL = 32, 120
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
# which of the app's answers each model decides
ANSWER_OF = {"dddd_ocr_old": "default", "dddd_ocr": "beta"}


def shipped_models() -> dict[str, str]:
    import importlib.util

    package = Path(importlib.util.find_spec("ddddocr").origin).parent
    return {"dddd_ocr_old": str(package / "common_old.onnx"), "dddd_ocr": str(package / "common.onnx")}


def captcha(rng: np.random.Generator) -> bytes:
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    width, height = int(rng.integers(120, 201)), int(rng.integers(40, 71))
    background = tuple(int(v) for v in rng.integers(170, 256, 3))
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 6))):  # interference lines and arcs
        color = tuple(int(v) for v in rng.integers(60, 200, 3))
        box = sorted(rng.integers(0, width, 2).tolist()), sorted(rng.integers(0, height, 2).tolist())
        if rng.random() < 0.5:
            draw.line([(box[0][0], box[1][0]), (box[0][1], box[1][1])], fill=color, width=int(rng.integers(1, 3)))
        else:
            draw.arc(
                [box[0][0], box[1][0], box[0][1] + 1, box[1][1] + 1],
                int(rng.integers(0, 180)),
                int(rng.integers(180, 360)),
                fill=color,
            )
    count = int(rng.integers(4, 7))
    step = (width - 10) / count
    for index in range(count):
        char = CHARS[int(rng.integers(0, len(CHARS)))]
        size = int(height * rng.uniform(0.55, 0.8))
        font = ImageFont.load_default(size=size)
        glyph = Image.new("L", (size * 2, size * 2), 0)
        ImageDraw.Draw(glyph).text((size // 2, size // 3), char, fill=255, font=font)
        glyph = glyph.rotate(float(rng.uniform(-25, 25)), resample=Image.BICUBIC)
        ink = Image.new("RGB", glyph.size, tuple(int(v) for v in rng.integers(0, 120, 3)))
        x = int(5 + index * step + rng.uniform(-3, 3) - size // 2)
        y = int((height - glyph.size[1]) / 2 + rng.uniform(-4, 4))
        image.paste(ink, (x, y), glyph)
    pixels = np.asarray(image, np.float32)
    pixels += rng.normal(0, rng.uniform(2, 12), pixels.shape)
    speckle = rng.random(pixels.shape[:2]) < rng.uniform(0, 0.03)
    pixels[speckle] = rng.integers(0, 256, (int(speckle.sum()), 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    if rng.random() < 0.5:
        image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.9))))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def inputs(split: str) -> list[bytes]:
    if split == "calib":
        rng = np.random.default_rng(2201)
        return [captcha(rng) for _ in range(CALIBRATION)]
    rng = np.random.default_rng(2202)
    items = [captcha(rng) for _ in range(DEV_EVAL)]
    return items[0::2] if split == "dev" else items[1::2]


def build():
    import ddddocr

    return {"default": ddddocr.DdddOcr(show_ad=False), "beta": ddddocr.DdddOcr(beta=True, show_ad=False)}


def answer(apps, png: bytes) -> dict:
    return {name: app.classification(png) for name, app in apps.items()}


def score(reference: list[dict], candidate: list[dict], key: str) -> dict:
    """String agreement (%) of the answer that ``key``'s model decides."""
    field = ANSWER_OF[key]
    pairs = list(zip(reference, candidate))
    changed = [f"{a[field]}->{b.get(field, b.get('error', '?'))}" for a, b in pairs if a[field] != b.get(field)]
    return {"value": percent_equal(pairs, lambda d: d.get(field)), "n": len(pairs), "detail": "",
            "examples": changed[:4]}
