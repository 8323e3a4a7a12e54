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


def document(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A whole document page as a layout detector sees it, RGB in 0..255, (3, H, W): a title,
    paragraphs of text lines in one or two columns, and now and then a figure (a scene), a table
    (ruled cells with short text) or a caption, stacked top to bottom."""
    page_tone = rng.uniform(215, 250)
    canvas = np.full((3, height, width), page_tone, np.float32)
    margin = int(width * rng.uniform(0.05, 0.1))
    columns = 2 if rng.random() < 0.35 else 1
    gutter = int(width * 0.04)
    column_w = (width - 2 * margin - (columns - 1) * gutter) // columns
    y = int(height * rng.uniform(0.04, 0.08))
    # the title, larger and centred
    title_h = int(rng.integers(24, 40))
    title_w = int(rng.uniform(0.4, 0.8) * (width - 2 * margin))
    x = (width - title_w) // 2
    canvas[:, y:y + title_h, x:x + title_w] = text_line(rng, title_h, title_w)[None]
    y += title_h + int(rng.integers(12, 28))
    tops = [y] * columns
    while True:
        column = int(np.argmin(tops))
        y, left = tops[column], margin + column * (column_w + gutter)
        kind = rng.choice(["text", "text", "text", "figure", "table"])
        if kind == "text":
            lines, line_h = int(rng.integers(2, 8)), int(rng.integers(11, 17))
            block = lines * (line_h + 3)
            if y + block > height - margin:
                break
            for row in range(lines):
                w = column_w if row < lines - 1 else int(column_w * rng.uniform(0.3, 0.9))
                canvas[:, y + row * (line_h + 3):y + row * (line_h + 3) + line_h, left:left + w] = \
                    text_line(rng, line_h, w)[None]
        elif kind == "figure":
            h = int(column_w * rng.uniform(0.4, 0.75))
            block = h + 18
            if y + block > height - margin:
                break
            w = int(column_w * rng.uniform(0.6, 1.0))
            x = left + (column_w - w) // 2
            canvas[:, y:y + h, x:x + w] = scene(rng, h, w)
            canvas[:, y + h + 4:y + h + 16, x:x + w // 2] = text_line(rng, 12, w // 2)[None]  # the caption
        else:
            rows, cols = int(rng.integers(3, 7)), int(rng.integers(2, 5))
            cell_h, cell_w = int(rng.integers(16, 24)), column_w // cols
            block = rows * cell_h
            if y + block > height - margin:
                break
            ink = rng.uniform(20, 90)
            for r in range(rows):
                for c in range(cols):
                    cy, cx = y + r * cell_h, left + c * cell_w
                    text_w = int(cell_w * rng.uniform(0.3, 0.8))
                    canvas[:, cy + 3:cy + cell_h - 3, cx + 3:cx + 3 + text_w] = text_line(rng, cell_h - 6, text_w)[None]
            for r in range(rows + 1):
                canvas[:, min(y + r * cell_h, height - 1), left:left + cols * cell_w] = ink
            for c in range(cols + 1):
                canvas[:, y:y + block, min(left + c * cell_w, width - 1)] = ink
        tops[column] = y + block + int(rng.integers(10, 24))
    tint = rng.uniform(0.92, 1.0, 3).astype(np.float32)
    return np.clip(canvas * tint[:, None, None] + rng.normal(0, 2.0, canvas.shape).astype(np.float32), 0, 255)


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
