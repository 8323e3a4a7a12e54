"""The options of every step, as data: field types, defaults, help text and validation.

Kept apart from the steps themselves so that the command line can be built (and ``--help``
answered) without importing onnx, numpy or ONNX Runtime. Config keys are the field names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortprep.errors import UsageError
from ortprep.options.fields import Kind, StepOptions, option
from ortprep.options.groups import (
    METRIC_KINDS_DETAILED,
    check_device,
    check_share,
    data_option,
    device_option,
    metrics_option,
    min_share_option,
    provider_options_option,
    runtimes_option,
    shapes_option,
)

MAX_ROUNDS = 8  # convert --fp16: mixed-precision rounds


def _known_release(version: str | None, where: str) -> None:
    if version is not None:
        from ortprep.eps.ort_releases import release_limits

        try:
            release_limits(version)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc.message}", hint=exc.hint) from None


LEVELS = ("basic", "extended", "all")  # optimize
MODES = ("static", "dynamic", "weight-only")  # quantize
ROUNDINGS = ("auto", "nearest", "gptq")  # quantize --weight-only
ENGINES = ("auto", "ort", "nncf", "aimet")  # quantize --engine (steps/quantize/engines/base.ENGINE_CHOICES)
ACCURACY_LEVELS = ("auto", "0", "1", "2", "3", "4")  # quantize --weight-only: MatMulNBits' accuracy_level
WEIGHT_ONLY_BITS = ("int4", "int8")
DEFAULT_MIN_COSINE = 0.99  # quantize's accuracy gate
DEFAULT_TIMEOUT = 300.0  # load: seconds per EP
# The time one judgement may take on the target EP (runtime/budget.py); why 180 s and 900 s below:
# docs/decisions/seams-ep-time-budgets.md
EP_SECONDS = 180.0
EP_SECONDS_HELP = ("Seconds the target EP may take to judge the samples of one run (held-back, calibration or --eval "
                   "samples): where one sample takes long there (QNN's HTP simulator on x86 at large inputs), the "
                   "first samples that fit are judged, at least 2, and the report says how many.")
# The time all of a quantize step's judgements may take on the target EP together (runtime/budget.py,
# EpClock): every attempt of --auto, each with its baseline, calibration samples, search and trials.
EP_TOTAL_SECONDS = 900.0
# quantize's own bound: the step ends within it, its EP judgements and search trials included
# (runtime/budget.py StepTimes; docs/decisions/speed-ep-verdict.md)
STEP_SECONDS = 840.0
SHAPES_HELP = "Shape of a symbolic input: NAME=DIMS (repeatable)."  # load, package
RUNTIMES_RUN_HELP = ("Run an EP under another environment's Python (its own ONNX Runtime flavour): EP=PYTHON "
                     "(repeatable), e.g. openvino-cpu=.venv-openvino/bin/python.")  # load, package


@dataclass
class VerifyOptions(StepOptions):
    """How a transform's result is checked and written (shared by convert, simplify, optimize)."""

    shapes: dict[str, list[int]] = shapes_option(
        "Feed shape of a symbolic input for the verification run: NAME=DIMS (repeatable).")
    dims: dict[str, int] = option(
        {}, "Size of a named symbolic dimension for the verification run: NAME=SIZE (repeatable).", Kind.DIMS,
        flags=("--dim", "--dims"), metavar="NAME=SIZE")
    inputs: Path | None = option(None, "Verify on these inputs (.npz, one array per input).", Kind.PATH)
    verify: bool = option(True, "Run the original and the result in ORT and compare before writing.", Kind.FLAG)
    keep_failed: bool = option(False, "Keep a result that fails verification beside the output as NAME.failed.onnx "
                               "(never at -o).", Kind.FLAG)
    metrics: dict[str, str] = metrics_option("held to the result besides cosine")


@dataclass
class InspectOptions(StepOptions):
    """Options of ``inspect`` (config keys = field names)."""

    hash_data: bool = option(False, "Also sha256 the external-data files (reads them).", Kind.FLAG)
    ort_version: str | None = option(None, "Also check against this ONNX Runtime release (e.g. 1.24, the one that "
                                     "ships your EP): the IR versions and opsets it loads.", Kind.TEXT, metavar="X.Y")

    def validate(self, where: str) -> None:
        _known_release(self.ort_version, where)


@dataclass
class CheckOptions(StepOptions):
    """Options of ``check`` (config keys = field names)."""

    eps: list[str] = option([], "Target EP (repeatable: separate targets); a comma list is one session's priority "
                            "list, e.g. openvino-cpu,dml.", Kind.TARGETS, flags=("--ep", "--eps"), metavar="EP")
    ort_version: str | None = option(None, "Also check against this ONNX Runtime release (e.g. 1.24, the one that "
                                     "ships your EP): the IR versions and opsets it loads.", Kind.TEXT, metavar="X.Y")
    html: Path | None = option(None, "Also write a self-contained HTML page of the graph, each node coloured by where "
                               "it runs on each target.", Kind.PATH, metavar="FILE")
    graph: bool = option(False, "Put the main graph (nodes, edges, each target's partitions) into the report, for "
                         "drawing it (--html and run --html set it).", Kind.FLAG, cli=False)
    prove: bool = option(False, "Build the real session where the EP runs here (the QNN HTP simulator, OpenVINO "
                         "through --runtime, CPU, CUDA/TensorRT when present) and report its placement next to the "
                         "prediction; the verdict is then the session's outcome.", Kind.FLAG)
    provider_options: dict[str, dict[str, str]] = provider_options_option(
        "With --prove: an EP's session option, as your application sets it: EP:KEY=VALUE (repeatable).")
    runtimes: dict[str, Path] = runtimes_option("With --prove: build an EP's session under another environment's "
                                                "Python (its own ONNX Runtime flavour): EP=PYTHON (repeatable).")
    timeout: float = option(DEFAULT_TIMEOUT, "With --prove: seconds per EP before its session counts as hung.",
                                             Kind.FLOAT,
                            minimum=0.1)
    device: str | None = device_option()
    min_share: float | None = min_share_option("in the real session with --prove (else as the tables predict)")

    def validate(self, where: str) -> None:
        _known_release(self.ort_version, where)
        check_device(self.device, self.eps, self.provider_options, where)
        check_share(self.min_share, where)
        if not self.eps:
            raise UsageError(f"{where}: no EP given", hint='name a target: --ep dml, or eps = ["dml"] in a config; '
                             "ortprep check --list-eps lists them")


@dataclass
class ConvertOptions(VerifyOptions):
    """Options of ``convert`` (config keys = field names)."""

    fp16: bool = option(False, "Convert float32 to float16, verified, with mixed precision where needed.", Kind.FLAG)
    ep: str | None = option(None, "Target EP: ops it has no FP16 kernel for stay FP32; sets the FP16 I/O default. "
                            "Without it: every op with a float16 signature in ONNX becomes FP16.", Kind.EP)
    keep_io_types: bool | None = option(
        None, "Keep float32 inputs/outputs (default), or make them float16 (the default for EPs that feed FP16, e.g. "
              "dml-npu).",
        Kind.TRISTATE, off_flag="--fp16-io")
    block_ops: tuple[str, ...] = option((), "Op type to keep in FP32 (repeatable).", Kind.NAMES,
                                        flags=("--block-op", "--block-ops"), metavar="OP")
    block_nodes: tuple[str, ...] = option((), "Node name to keep in FP32 (repeatable).", Kind.NAMES,
                                          flags=("--block-node", "--block-nodes"), metavar="NODE")
    rescale: bool = option(True, "FP16: where activations overflow FP16 on the inputs, scale the input feeding them "
                           "down by a power of two and take the scale out where a Log absorbs it (verified), "
                           "instead of keeping those nodes in FP32, which an EP computing in FP16 does not "
                           "(QNN's HTP, DirectML NPUs).", Kind.FLAG)
    opset: int | None = option(None, "Convert to this opset (onnx version converter).", Kind.INT, minimum=1)
    ir_version: int | None = option(None, "Stamp this (older) ONNX IR version, for a runtime that refuses newer ones; "
                                    "verified like every transform.", Kind.INT, minimum=3)
    fix_shapes: dict[str, list[int]] = option({}, "Make an input static: NAME=1,3,224,224 (repeatable).", Kind.SHAPES,
                                              flags=("--fix-shape", "--fix-shapes"), metavar="NAME=DIMS")
    fix_dims: dict[str, int] = option({}, "Fix a named symbolic dimension: batch=1 (repeatable).", Kind.DIMS,
                                      flags=("--fix-dim", "--fix-dims"), metavar="NAME=SIZE")
    conv1d_to_conv2d: bool = option(False, "Rewrite 1-D Conv/ConvTranspose/pooling as 2-D.", Kind.FLAG)
    keep_off_ep: tuple[str, ...] = option(
        (), "Run this node on the CPU EP, whatever EP takes the rest (repeatable): it moves into an If whose two "
        "branches are the node, which no EP takes; check --prove prints the nodes that make a session fail.",
        Kind.NAMES, flags=("--keep-off-ep",), metavar="NODE")
    rewrite_for: str | None = option(
        None, "Decompose the ops this EP does not take into ops its table says it does (HardSwish as x * "
        "HardSigmoid(x), LayerNormalization as reductions, ...), verified; the placement before and after is reported.",
        Kind.EP, flags=("--rewrite-for",), metavar="EP")
    runtimes: dict[str, Path] = runtimes_option("With --rewrite-for: prove the placement under another "
                                                "environment's Python (its own ONNX Runtime flavour): EP=PYTHON "
                                                "(repeatable).")
    repair: bool = option(False, "Repair defects converters write that are safe to repair (an opset imported twice); "
                          "every convert does this, --repair alone does nothing else.", Kind.FLAG)
    min_cosine: float = option(0.999, "FP16 gate: lowest cosine similarity per output.", Kind.FLOAT, minimum=-1.0)
    max_rounds: int = option(MAX_ROUNDS, "FP16: most mixed-precision rounds before giving up.", Kind.INT, minimum=1)

    def any_transform(self) -> bool:
        return bool(self.fp16 or self.opset or self.ir_version or self.fix_shapes or self.fix_dims
                    or self.conv1d_to_conv2d or self.keep_off_ep or self.rewrite_for or self.repair)

    def validate(self, where: str) -> None:
        if not self.any_transform():
            raise UsageError(f"{where}: nothing to do",
                             hint="give at least one of fp16, opset, ir_version, fix_shapes, fix_dims, "
                                  "conv1d_to_conv2d, keep_off_ep, rewrite_for, repair (--fp16, --opset, --ir-version, "
                                  "--fix-shape, --fix-dim, --conv1d-to-conv2d, --keep-off-ep, --rewrite-for, --repair)")


@dataclass
class SimplifyOptions(VerifyOptions):
    """Options of ``simplify`` (config keys = field names)."""

    onnxsim: bool = option(True, "Use onnxsim (constant folding, shape inference).", Kind.FLAG)
    onnxoptimizer: bool = option(True, "Use onnxoptimizer's fuse-and-eliminate passes.", Kind.FLAG)
    skip_passes: tuple[str, ...] = option((), "onnxoptimizer pass to leave out (repeatable).", Kind.NAMES,
                                          flags=("--skip-pass", "--skip-passes"), metavar="PASS")


@dataclass
class OptimizeOptions(VerifyOptions):
    """Options of ``optimize`` (config keys = field names)."""

    level: str = option("extended", "ORT graph optimization level.", Kind.TEXT, choices=LEVELS)


@dataclass
class QuantizeOptions(StepOptions):
    """Options of ``quantize`` (config keys = field names)."""

    mode: str | None = option(None, "static (calibrated activations), dynamic (int8 weights, activations quantized at "
                              "run time) or weight-only (block-wise int4/int8 MatMul weights, float activations: "
                              "MatMulNBits).", Kind.TEXT, choices=MODES,
                              shortcuts=(("--static", "static"), ("--dynamic", "dynamic")))
    weight_only: str | None = option(None, "Weight-only quantization of MatMul weights to int4 or int8, block-wise "
                                     "(ORT's MatMulNBits; sets mode = weight-only).", Kind.TEXT,
                                     choices=WEIGHT_ONLY_BITS,
                                     metavar="int4|int8")
    block_size: int = option(32, "--weight-only: weights per block sharing a scale (16, 32, 64, 128 or 256).", Kind.INT,
                             minimum=16)
    symmetric: bool = option(False, "--weight-only: symmetric blocks (no zero points).", Kind.FLAG)
    rounding: str = option("auto", "--weight-only: how weights take their levels. nearest (ORT's own); gptq: "
                           "each weight's rounding error moved onto the weights not yet rounded, so that the MatMul's "
                           "output on the calibration samples stays closest (needs --calib DATA); auto: nearest, "
                           "then gptq where nearest fails the gate and calibration samples exist.", Kind.TEXT,
                           choices=ROUNDINGS)
    accuracy_level: str = option("auto", "--weight-only: MatMulNBits' accuracy_level, the lowest precision its "
                                 "activations may be computed in: 0 (the EP's default: float32 on the CPU EP), 1 "
                                 "float32, 2 float16, 3 bfloat16, 4 int8 (activations quantized per block at run "
                                 "time). auto: 4 with the CPU EP as the target (its int8 kernel: measured about 4x "
                                 "faster than float on a 1x4096 by 4096x4096 MatMul, where level 0 was 1.4x slower), "
                                 "else 0; then 0 (the more precise) is kept where it passes and 4 fails the gate or "
                                 "does not run in at most 0.9x its time (and 0.1 ms less) on the samples' shapes.",
                                 Kind.TEXT, choices=ACCURACY_LEVELS,
                                 metavar="auto|0-4")
    calib: str | Path | None = data_option("Calibration data: folder of .npz/.npy/images, a stacked .npz, or "
                                           "'random'.")
    eval: str | Path | None = data_option("Evaluation data (same forms as calib); default: every fifth calibration "
                                          "sample, held back (--weight-only: every second, where it may round on "
                                          "them; dynamic: all of them). Without either, quantize refuses (QNT033); "
                                          "'random' judges on seeded random inputs instead, as asked.")
    ep: str = option("cpu", "Target EP: sets the preset (format, types, per-channel).", Kind.EP)
    format: str | None = option(None, "Override the preset's format.", Kind.TEXT, choices=("qdq", "qoperator"))
    per_channel: bool | None = option(None, "Override the preset's weight granularity (per channel or per tensor).",
                                      Kind.TRISTATE, off_flag="--per-tensor")
    method: str = option("minmax", "Calibration method.", Kind.TEXT, choices=("minmax", "entropy", "percentile"))
    engine: str | None = option(None, "Quantization engine: ort (ONNX Runtime's quantizer: every mode and precision), "
                                "nncf (NNCF: bias correction, SmoothQuant on MatMul/Gemm models; static 8-bit QDQ "
                                "only; pip install 'ortprep[nncf]'), aimet (AIMET-ONNX: cross-layer equalization, "
                                "SeqMSE; ortprep[aimet]), or auto: each available engine that supports the settings, "
                                "ort first, judged by the same gate; the first that passes is kept (else the best) and "
                                "--auto-exclude searches on it. Default: ort; with --auto, auto.", Kind.TEXT,
                                choices=ENGINES)
    weight_type: str | None = option(None, "Override the preset's weight type.", Kind.TEXT,
                                           choices=("int8", "uint8", "int16", "uint16"))
    activation_type: str | None = option(None, "Override the preset's activation type.", Kind.TEXT,
                                         choices=("uint8", "int8", "uint16"))
    exclude_ops: tuple[str, ...] = option((), "Op type to leave in float (repeatable).", Kind.NAMES,
                                          flags=("--exclude-op", "--exclude-ops"), metavar="OP")
    exclude_nodes: tuple[str, ...] = option((), "Node to leave in float (repeatable).", Kind.NAMES,
                                            flags=("--exclude-node", "--exclude-nodes"), metavar="NODE")
    samples: int | None = option(None, "Use at most this many calibration samples.", Kind.INT, minimum=1)
    preprocess: bool = option(True, "Run ORT's quantization pre-processing first.", Kind.FLAG)
    image_size: tuple[float, ...] | None = option(None, "Image calibration: H,W.", Kind.FLOATS, metavar="H,W")
    mean: tuple[float, ...] | None = option(None, "Image calibration: per-channel mean (after scaling to 0..1).",
                                            Kind.FLOATS, metavar="M,M,M")
    std: tuple[float, ...] | None = option(None, "Image calibration: per-channel std.", Kind.FLOATS, metavar="S,S,S")
    layout: str = option("nchw", "Image calibration: nchw or nhwc.", Kind.TEXT, choices=("nchw", "nhwc"))
    min_cosine: float = option(DEFAULT_MIN_COSINE, "Accuracy gate: lowest cosine per output on held-back samples.",
                               Kind.FLOAT, minimum=-1.0)
    auto_exclude: bool = option(False, "Search for the fewest nodes to keep in float that pass the gate: op-type rules "
                                "first (kept when they help), then the nodes ranked by the error they add, bisected.",
                                Kind.FLAG)
    max_exclude_rounds: int = option(16, "Most quantize-and-evaluate trials --auto-exclude runs after the first, "
                                     "before its bisection from the float end (about log2(nodes) + 1 more).", Kind.INT,
                                     minimum=1)
    search_seconds: float = option(240.0, "--auto-exclude starts no trial this many seconds after the first one and "
                                   "keeps the best so far (with --auto, over all the precisions tried).", Kind.FLOAT,
                                   minimum=1.0)
    ep_seconds: float = option(EP_SECONDS, EP_SECONDS_HELP, Kind.FLOAT, minimum=1.0)
    ep_total_seconds: float = option(EP_TOTAL_SECONDS, "Seconds the target EP may take over the whole step (every "
                                     "judgement of every attempt --auto makes): once spent, no later trial runs there, "
                                     "so none can pass the gate on it; --auto's FP16 probe still gets one judgement.",
                                     Kind.FLOAT, minimum=1.0)
    step_seconds: float = option(STEP_SECONDS, "Seconds the whole step may take: no judgement on the target EP, "
                                 "search trial or further engine starts once what is left would not hold it, and the "
                                 "step ends with the verdict it has (a candidate not judged on the EP cannot pass).",
                                 Kind.FLOAT, minimum=1.0)
    max_float_share: float = option(0.5, "--auto-exclude keeps at most this share of the quantizable weights in float: "
                                    "its search ends at a pass or at this cap (1: at the float model); the report "
                                    "gives the share left quantized.", Kind.FLOAT, minimum=0.0)
    auto: bool = option(False, "When the precision asked for fails the gate, try the others in order (A16W8, "
                        "A16W16 for QNN, dynamic int8; or static after dynamic) and write the first that passes.",
                        Kind.FLAG)
    metrics: dict[str, str] = metrics_option("for the gate", METRIC_KINDS_DETAILED)
    keep_failed: bool = option(False, "Keep a refused result (the gate failed, nothing was quantized, or it is not "
                               "smaller) beside the output as NAME.failed.onnx; nothing is written at the output.",
                               Kind.FLAG)
    verify: bool = option(True, "Evaluate the quantized model against the float one on held-back samples.", Kind.FLAG)
    device: str | None = device_option()
    on_ep: bool | None = option(None, "Judge the accuracy gate on the target EP's own outputs where that EP runs here "
                                "(default), or on the CPU EP only (--gate-on-cpu).", Kind.TRISTATE,
                                flags=("--gate-on-ep",),
                                off_flag="--gate-on-cpu")
    provider_options: dict[str, dict[str, str]] = provider_options_option(
        "The target EP's session option for the evaluation on the EP: EP:KEY=VALUE (repeatable).")
    runtimes: dict[str, Path] = runtimes_option("Evaluate on an EP under another environment's Python (its own ONNX "
                                                "Runtime flavour): EP=PYTHON (repeatable).")

    def validate(self, where: str) -> None:
        check_device(self.device, [self.ep], self.provider_options, where)
        if self.weight_only is not None:
            if self.mode not in (None, "weight-only"):
                raise UsageError(f"{where}: --weight-only and mode {self.mode} ask for two quantizations",
                                 hint="pass one of --static, --dynamic, --weight-only int4|int8")
            self.mode = "weight-only"
        if self.mode == "weight-only":
            self.weight_only = self.weight_only or "int4"
            if self.block_size not in (16, 32, 64, 128, 256):
                raise UsageError(f"{where}: block size {self.block_size} is not one MatMulNBits takes",
                                 hint="use 16, 32, 64, 128 or 256")
            if self.rounding == "gptq" and (self.calib is None or str(self.calib) == "random"):
                raise UsageError(f"{where}: --rounding gptq measures each MatMul's inputs on calibration samples, and "
                                 "none were given", hint="pass real samples with --calib DATA, or --rounding nearest")
        elif self.mode is not None:
            for name, value in (("--rounding", self.rounding), ("--accuracy-level", self.accuracy_level)):
                if value != "auto":
                    raise UsageError(f"{where}: {name} applies to --weight-only",
                                     hint=f"drop {name}, or add --weight-only int4|int8")
        if self.mode is None:
            raise UsageError(f"{where}: no quantization mode",
                             hint='set mode = "static", "dynamic" or "weight-only" (--static, '
                             "--dynamic or --weight-only int4|int8)")
        from ortprep.eps.registry import EPS, resolve_ep

        spec = resolve_ep(self.ep)
        if spec.quantize is None:
            with_presets = ", ".join(s.name for s in EPS if s.quantize is not None)
            raise UsageError(f"{where}: no quantization preset for '{self.ep}'", hint=f"use one of: {with_presets}")
        if self.mode == "static" and not self.calib:
            raise UsageError(f"{where}: static quantization needs calibration data",
                             hint="pass --calib DIR, calib = \"DIR\" in a config (or 'random' to accept random data)")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise UsageError(f"{where}: image_size needs two positive numbers", hint="e.g. --image-size 224,224")

    def engine_name(self) -> str:
        """The engine asked for: --engine, else auto with --auto and ort without."""
        return self.engine or ("auto" if self.auto else "ort")

    def image(self):
        """The image-calibration settings (ImageOptions)."""
        size = (int(self.image_size[0]), int(self.image_size[1])) if self.image_size else None
        return ImageOptions(size=size, mean=self.mean or (0.0, 0.0, 0.0), std=self.std or (1.0, 1.0, 1.0),
                            layout=self.layout)


@dataclass
class ImageOptions:
    """How calibration images become a model input (runtime/calibration.py reads them)."""

    size: tuple[int, int] | None = None  # (height, width); default: the model's input shape
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    layout: str = "nchw"
    scale: float = 1.0 / 255.0


# The levels `load --optimization` takes: ORT's default (every level) and each level by name.
OPTIMIZATION_LEVELS = ("default", "extended", "basic", "off")


@dataclass
class LoadOptions(StepOptions):
    """Options of ``load`` (config keys = field names)."""

    eps: list[str] = option([], "EP to test (repeatable); default: every available one.", Kind.EP_LIST,
                            flags=("--ep", "--eps"), metavar="EP")
    inputs: Path | None = option(None, "Run on these inputs (.npz, one array per input).", Kind.PATH)
    shapes: dict[str, list[int]] = shapes_option(SHAPES_HELP)
    runs: int = option(10, "Timed runs after the warm-up.", Kind.INT, minimum=1)
    provider_options: dict[str, dict[str, str]] = provider_options_option(
        "An EP's session option: EP:KEY=VALUE (repeatable).")
    timeout: float = option(DEFAULT_TIMEOUT, "Seconds per EP before it counts as hung.", Kind.FLOAT, minimum=0.1)
    no_fallback: bool = option(False, "Fail when any node falls back to the CPU.", Kind.FLAG, off_flag="--fallback-ok")
    profile: bool = option(False, "ORT's profiler: the ten ops taking the most time, per EP.", Kind.FLAG)
    custom_op_library: Path | None = option(None, "Register this custom-op library in every session.", Kind.PATH)
    runtimes: dict[str, Path] = runtimes_option(RUNTIMES_RUN_HELP)
    reference: Path | None = option(None, "The float model this one was quantized (or converted) from: each EP's "
                                    "result then tells quantization loss (CPU int8 vs float) apart from EP error "
                                    "(EP vs CPU int8).", Kind.PATH)
    placement_off: bool = option(False, "Also record placement with graph optimizations off (node names as in the "
                                 "file); placement is always recorded at the default level a user's session gets.",
                                 Kind.FLAG)
    device: str | None = device_option()
    metrics: dict[str, str] = metrics_option("where an output beyond the elementwise tolerance may still hold")
    min_share: float | None = min_share_option("in its session (each EP named with --ep)")
    optimization: str = option("default", "ORT's graph optimization level of each EP's session (default, extended, "
                               "basic or off), as the application "
                               "sets it (the CPU EP's reference run keeps ORT's default).", Kind.TEXT,
                               choices=OPTIMIZATION_LEVELS, metavar="LEVEL")
    disabled_optimizers: tuple[str, ...] = option((), "Leave this ORT graph optimizer out of each EP's session, by "
                                                  "ORT's name, as the application does (repeatable).", Kind.NAMES,
                                                  flags=("--disable-optimizer",), metavar="NAME")

    def validate(self, where: str) -> None:
        check_device(self.device, self.eps, self.provider_options, where)
        check_share(self.min_share, where)
        if self.reference is not None and not Path(self.reference).is_file():
            raise UsageError(f"{where}: reference model not found: {self.reference}",
                             hint="pass the float model's path")
        if self.custom_op_library is not None and not Path(self.custom_op_library).is_file():
            raise UsageError(f"{where}: custom-op library not found: {self.custom_op_library}",
                             hint="pass the path of the .so/.dll")


@dataclass
class DoctorOptions(StepOptions):
    """Options of ``doctor`` (config keys = field names)."""

    scan: Path | None = option(None, "Read the Python and requirements files under PATH for ORT pitfalls (never runs "
                               "them).", Kind.PATH, metavar="DIR")
    runtimes: dict[str, Path] = runtimes_option("Also ask another environment's ONNX Runtime about an EP: EP=PYTHON "
                                                "(repeatable).")

    ort_version: str | None = option(None, "Also show what this ONNX Runtime release loads (IR version, opset).",
                                     Kind.TEXT, metavar="X.Y")

    def validate(self, where: str) -> None:
        _known_release(self.ort_version, where)
        if self.scan is not None and not Path(self.scan).exists():
            raise UsageError(f"{where}: nothing to scan at {self.scan}", hint="pass a folder or a .py file")



COMPILE_EPS = ("qnn", "openvino-cpu", "openvino-gpu", "openvino-npu")  # EPs whose EPContext output ortprep writes


@dataclass
class CompileOptions(StepOptions):
    """Options of ``compile`` (config keys = field names)."""

    ep: str = option("qnn", "EP to compile for: qnn or openvino-cpu|gpu|npu.", Kind.EP)
    inputs: Path | None = option(None, "Compare on these inputs (.npz, one array per input).", Kind.PATH)
    shapes: dict[str, list[int]] = shapes_option(
        "Shape of a symbolic input for the comparison run: NAME=DIMS (repeatable).")
    provider_options: dict[str, dict[str, str]] = provider_options_option(
        "An EP's session option: EP:KEY=VALUE (repeatable).")
    runtimes: dict[str, Path] = runtimes_option("Compile under another environment's Python (its own ONNX Runtime "
                                                "flavour): EP=PYTHON (repeatable).")
    timeout: float = option(DEFAULT_TIMEOUT, "Seconds before the compile counts as hung.", Kind.FLOAT, minimum=0.1)
    ep_seconds: float = option(EP_SECONDS, EP_SECONDS_HELP, Kind.FLOAT, minimum=1.0)
    keep_failed: bool = option(False, "Keep a compiled model whose outputs differ beside the output as "
                               "NAME.failed.onnx (never at -o).", Kind.FLAG)
    device: str | None = device_option()
    eval: str | Path | None = data_option("Also compare on these samples (a folder of .npz/.npy, or a stacked .npz; "
                                          f"up to {32} of them): each is judged as the --inputs run is, and one "
                                          "beyond the tolerance fails the compile.")
    metrics: dict[str, str] = metrics_option("where an output beyond the elementwise tolerance may still hold")

    def validate(self, where: str) -> None:
        check_device(self.device, [self.ep], self.provider_options, where)
        if self.ep not in COMPILE_EPS:
            raise UsageError(f"{where}: ortprep compiles EPContext models for {', '.join(COMPILE_EPS)}, not {self.ep}",
                             hint="choose --ep qnn or --ep openvino-cpu")
