"""Realistic inputs for the corpus, made from code (nothing downloaded): rendered text lines and
pages for OCR models, scenes with shapes for detectors, tones and chirps for audio models,
real file bytes for a file-type classifier.

The text uses a 5x7 dot font drawn here (digits and capitals), scaled, with ink of varying
darkness on paper of varying brightness, a little blur and sensor noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# 5x7 glyphs: each string is one row, '#' is ink.
FONT = {
    "0": [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    "1": ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "2": [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    "3": ["####.", "....#", "....#", ".###.", "....#", "....#", "####."],
    "4": ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    "5": ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    "6": [".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."],
    "7": ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    "8": [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    "9": [".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."],
    "A": [".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"],
    "B": ["####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."],
    "C": [".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."],
    "D": ["####.", "#...#", "#...#", "#...#", "#...#", "#...#", "####."],
    "E": ["#####", "#....", "#....", "####.", "#....", "#....", "#####"],
    "F": ["#####", "#....", "#....", "####.", "#....", "#....", "#...."],
    "G": [".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".###."],
    "H": ["#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"],
    "I": [".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "K": ["#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"],
    "L": ["#....", "#....", "#....", "#....", "#....", "#....", "#####"],
    "M": ["#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"],
    "N": ["#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#", "#...#"],
    "O": [".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."],
    "P": ["####.", "#...#", "#...#", "####.", "#....", "#....", "#...."],
    "R": ["####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"],
    "S": [".####", "#....", "#....", ".###.", "....#", "....#", "####."],
    "T": ["#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."],
    "U": ["#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."],
    "V": ["#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."],
    "W": ["#...#", "#...#", "#...#", "#.#.#", "#.#.#", "##.##", "#...#"],
    "X": ["#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"],
    "Y": ["#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."],
    "Z": ["#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"],
}
GLYPHS = {char: np.array([[c == "#" for c in row] for row in rows], dtype=np.float32) for char, rows in FONT.items()}
ALPHABET = "".join(FONT)


def _blur(image: np.ndarray) -> np.ndarray:
    """A 3x3 box blur (edges of printed or photographed text are never hard)."""
    padded = np.pad(image, 1, mode="edge")
    return sum(padded[dy:dy + image.shape[0], dx:dx + image.shape[1]] for dy in range(3) for dx in range(3)) / 9.0


def text_line(rng: np.random.Generator, height: int, width: int, chars: int | None = None) -> np.ndarray:
    """A grayscale text line in 0..255 (dark ink on light paper), shape (height, width)."""
    paper = rng.uniform(190, 250)
    ink = rng.uniform(10, 90)
    canvas = np.full((height, width), paper, np.float32)
    scale = max(1, int(height * rng.uniform(0.55, 0.75)) // 7)
    glyph_w = 6 * scale
    count = chars or max(1, min(len(ALPHABET), (width - 4) // glyph_w - rng.integers(0, 3)))
    top = (height - 7 * scale) // 2 + int(rng.integers(-1, 2))
    left = int(rng.integers(2, max(3, width - count * glyph_w)))
    for index in range(count):
        glyph = np.kron(GLYPHS[ALPHABET[int(rng.integers(0, len(ALPHABET)))]], np.ones((scale, scale), np.float32))
        x = left + index * glyph_w
        if x + glyph.shape[1] > width or top < 0 or top + glyph.shape[0] > height:
            break
        region = canvas[top:top + glyph.shape[0], x:x + glyph.shape[1]]
        canvas[top:top + glyph.shape[0], x:x + glyph.shape[1]] = np.where(glyph > 0, ink, region)
    canvas = _blur(canvas) + rng.normal(0, 3.0, canvas.shape).astype(np.float32)
    return np.clip(canvas, 0, 255)


def page(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A document crop: several text lines of different sizes, RGB in 0..255, (3, H, W)."""
    paper = np.full((height, width), rng.uniform(200, 250), np.float32)
    y = int(rng.integers(4, 20))
    while y < height - 16:
        line_h = int(rng.integers(14, 34))
        if y + line_h > height:
            break
        line_w = int(rng.integers(width // 3, width - 8))
        x = int(rng.integers(2, width - line_w))
        paper[y:y + line_h, x:x + line_w] = text_line(rng, line_h, line_w)
        y += line_h + int(rng.integers(4, 16))
    tint = rng.uniform(0.9, 1.0, 3).astype(np.float32)
    return np.clip(paper[None] * tint[:, None, None], 0, 255)


def scene(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A photo-like scene: a gradient sky, filled rectangles and discs, some text; RGB 0..255."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([60 + 120 * yy / height + rng.uniform(-20, 20) for _ in range(3)])
    for _ in range(int(rng.integers(3, 7))):
        color = rng.uniform(0, 255, 3).astype(np.float32)
        if rng.random() < 0.5:
            y0, x0 = int(rng.integers(0, max(1, height * 7 // 8))), int(rng.integers(0, max(1, width * 7 // 8)))
            h = int(rng.integers(max(2, height // 16), max(3, height // 2)))
            w = int(rng.integers(max(2, width // 16), max(3, width // 2)))
            image[:, y0:y0 + h, x0:x0 + w] = color[:, None, None]
        else:
            cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(height / 30, height / 4)
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
            image[:, mask] = color[:, None]
    line_h = int(rng.integers(max(7, height // 20), max(8, min(28, height // 3))))
    margin = max(1, width // 40)
    y = int(rng.integers(0, max(1, height - line_h)))
    image[:, y:y + line_h, margin:width - margin] = text_line(rng, line_h, width - 2 * margin)[None]
    image = np.stack([_blur(c) for c in image]) + rng.normal(0, 4.0, image.shape).astype(np.float32)
    return np.clip(image, 0, 255)


def audio(rng: np.random.Generator, samples: int, rate: int = 16000) -> np.ndarray:
    """Speech-like audio in -1..1: a voiced tone with harmonics and a gliding pitch, syllable-like
    bursts, and background noise."""
    t = np.arange(samples, dtype=np.float32) / rate
    pitch = rng.uniform(90, 220) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 6))
    signal = 0.3 * voiced * envelope * rng.uniform(0.3, 1.0) + rng.normal(0, 0.01, samples)
    return np.clip(signal, -1, 1).astype(np.float32)


def file_bytes(paths: list[Path], index: int, window: int = 1024) -> np.ndarray:
    """magika's features of a real file: its first and last ``window`` bytes, padded with 256."""
    data = paths[index % len(paths)].read_bytes()
    begin = list(data[:window]) + [256] * max(0, window - len(data))
    end = [256] * max(0, window - len(data)) + list(data[-window:])
    return np.array([begin[:window] + end[-window:]], np.int32)
