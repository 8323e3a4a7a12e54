"""faster-whisper's voice activity detection (Silero VAD v6, the filter of ``transcribe(vad_filter=True)``):
which stretches of a recording it keeps as speech.

The app: ``faster_whisper.vad.get_speech_timestamps(audio)`` with faster-whisper's default
VadOptions (threshold 0.5, 2 s minimum silence, 400 ms padding); its answer is the list of
speech segments. The model: silero_vad_v6.onnx from faster_whisper/assets, fed the whole recording
at once as (windows, 576): each 512-sample window with 64 samples of context, so the batch size is
the recording's length.

Inputs: 8-24 s recordings at 16 kHz, made of speech-like bursts (bench/realistic.py's voiced
audio) separated by pauses of 0.3-3 s, over background noise of varying level, some with
non-speech events (a mains hum, a broadband noise burst, a click train). Calibration: 24
recordings from their own seed; development and evaluation: 80 recordings from another seed,
even positions development, odd positions evaluation. Metric: the share of 512-sample frames
(32 ms) whose speech / non-speech label equals the float model's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PACKAGES = ["faster-whisper"]
METRIC = "VAD frame agreement"
BOUND = ("min", 98.0)
RATE, WINDOW = 16000, 512
CALIBRATION, DEV_EVAL = 24, 80


def shipped_models() -> dict[str, str]:
    import importlib.util

    package = Path(importlib.util.find_spec("faster_whisper").origin).parent
    return {"silero_vad": str(package / "assets" / "silero_vad_v6.onnx")}


def recording(rng: np.random.Generator) -> np.ndarray:
    from bench import realistic

    seconds = rng.uniform(8, 24)
    total = int(seconds * RATE)
    noise_level = 10 ** rng.uniform(-3.0, -1.6)
    audio = rng.normal(0, noise_level, total).astype(np.float32)
    position = int(rng.uniform(0.2, 2.0) * RATE)
    while position < total - RATE // 4:
        length = min(int(rng.uniform(0.4, 3.0) * RATE), total - position)
        audio[position:position + length] += realistic.audio(rng, length) * rng.uniform(0.3, 1.5)
        position += length + int(rng.uniform(0.3, 3.0) * RATE)
    for _ in range(int(rng.integers(0, 3))):  # non-speech events
        start = int(rng.integers(0, total - RATE // 2))
        length = int(rng.uniform(0.2, 1.5) * RATE)
        t = np.arange(min(length, total - start), dtype=np.float32) / RATE
        kind = int(rng.integers(0, 3))
        if kind == 0:
            event = 0.1 * np.sin(2 * np.pi * 50 * t) + 0.05 * np.sin(2 * np.pi * 150 * t)
        elif kind == 1:
            event = rng.normal(0, rng.uniform(0.02, 0.2), t.size)
        else:
            event = np.zeros(t.size, np.float32)
            event[:: int(rng.integers(800, 3000))] = rng.uniform(0.3, 0.9)
        audio[start:start + t.size] += event.astype(np.float32)
    return np.clip(audio, -1, 1).astype(np.float32)


def inputs(split: str) -> list[np.ndarray]:
    if split == "calib":
        rng = np.random.default_rng(2101)
        return [recording(rng) for _ in range(CALIBRATION)]
    rng = np.random.default_rng(2102)
    items = [recording(rng) for _ in range(DEV_EVAL)]
    return items[0::2] if split == "dev" else items[1::2]


def build():
    from faster_whisper import vad

    # get_vad_model() is cached: clear it so the session is created after the swap is in place
    vad.get_vad_model.cache_clear()
    return vad


def answer(vad, audio: np.ndarray) -> dict:
    segments = vad.get_speech_timestamps(audio, vad.VadOptions())
    frames = np.zeros(-(-audio.size // WINDOW), np.uint8)
    for segment in segments:
        frames[segment["start"] // WINDOW: -(-segment["end"] // WINDOW)] = 1
    return {"samples": int(audio.size), "segments": [[s["start"], s["end"]] for s in segments],
            "frames": "".join(map(str, frames.tolist()))}


def score(reference: list[dict], candidate: list[dict], key: str | None = None) -> dict:
    """Frame agreement (%) over all recordings; segments whose count changed."""
    same = total = changed = 0
    for a, b in zip(reference, candidate):
        frames = a["frames"]
        total += len(frames)
        if "frames" not in b:
            continue
        same += sum(x == y for x, y in zip(frames, b["frames"]))
        changed += len(a["segments"]) != len(b["segments"])
    speech = sum(a["frames"].count("1") for a in reference) / max(1, total)
    return {"value": 100.0 * same / max(1, total), "n": len(reference),
            "detail": f"{changed} recordings with another segment count; float: {100 * speech:.0f}% speech frames"}
