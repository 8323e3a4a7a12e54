"""Findings: what a step noticed about a model, with a severity and a fix.

Codes are stable and never reused. The catalogue below is the single place that
gives each code its title, default severity and the kind of fix it calls for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum


class Severity(IntEnum):
    INFO = 10
    WARNING = 20
    ERROR = 30

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}") from None


@dataclass(frozen=True)
class FindingKind:
    code: str
    title: str
    severity: Severity


# code -> kind. Add new codes at the end of their block; never renumber.
CATALOGUE: dict[str, FindingKind] = {
    kind.code: kind
    for kind in (
        # MOD: the model file itself
        FindingKind("MOD001", "model fails onnx.checker", Severity.ERROR),
        FindingKind("MOD002", "opset newer than the installed ONNX Runtime supports", Severity.ERROR),
        FindingKind("MOD003", "opset newer than the installed onnx package knows", Severity.WARNING),
        FindingKind("MOD004", "ops from a custom domain need a custom-op library", Severity.WARNING),
        FindingKind("MOD005", "ops from the ONNX Runtime contrib domain run only on ONNX Runtime", Severity.INFO),
        FindingKind("MOD006", "ONNX Runtime is not installed", Severity.INFO),
        FindingKind("MOD007", "IR version newer than the installed onnx package knows", Severity.WARNING),
        FindingKind("MOD008", "no opset imported for the default ONNX domain", Severity.WARNING),
        FindingKind("MOD009", "IR version newer than the ONNX Runtime loads", Severity.ERROR),
        FindingKind("MOD010", "opset newer than the named ONNX Runtime release implements", Severity.ERROR),
        FindingKind("MOD011", "a domain imported more than once", Severity.WARNING),
        # EP: what an execution provider's tables say about nodes (severity depends on the EP)
        FindingKind("EP001", "the EP has no kernel for the op", Severity.WARNING),
        FindingKind("EP002", "the node's opset version is outside the EP's registered range", Severity.WARNING),
        FindingKind("EP003", "the EP does not take the node's data type", Severity.WARNING),
        FindingKind("EP004", "the EP takes the node only under a condition", Severity.INFO),
        FindingKind("EP005", "no data about the op (custom domain)", Severity.WARNING),
        FindingKind("EP006", "the graph splits between the EP and the CPU", Severity.WARNING),
        FindingKind("EP007", "no node runs on the EP", Severity.ERROR),
        FindingKind("EP008", "the node runs, at a cost (e.g. casts ORT inserts)", Severity.INFO),
        FindingKind("EP009", "a pattern measured to fail the EP's whole session", Severity.ERROR),
        FindingKind("EP010", "ORT itself runs small shape computations on the CPU beside the EP", Severity.INFO),
        # Rules beyond the tables
        FindingKind("DML001", "node stays out of the fused DirectML graph", Severity.INFO),
        FindingKind("DML002", "op never joins a fused DirectML graph", Severity.INFO),
        FindingKind("DML003", "DirectML declines the node (support query)", Severity.WARNING),
        FindingKind("DML004", "opset above what DirectML documents", Severity.WARNING),
        FindingKind("NPU001", "float32 tensors on a DirectML NPU", Severity.ERROR),
        FindingKind("NPU003", "1-D convolution or pooling on a DirectML NPU", Severity.WARNING),
        FindingKind("NPU004", "DirectML NPUs run a validated set of models only", Severity.INFO),
        FindingKind("SHP001", "dynamic input dimensions on an EP that wants static shapes", Severity.WARNING),
        FindingKind("QNN001", "float model on the QNN HTP backend", Severity.WARNING),
        FindingKind("QNN002", "QNN rejects a node whose tensors lack a static shape", Severity.WARNING),
        FindingKind("QNN003", "graph-input Q / graph-output DQ stay on the CPU with QNN's defaults", Severity.INFO),
        FindingKind("QNN004", "a pattern measured to fail the QNN session on this device", Severity.ERROR),
        FindingKind(
            "QNN005", "a QDQ weight channel whose requantization multiplier HTP computes wrongly", Severity.WARNING
        ),
        FindingKind(
            "QNN006", "a MatMul of two 16-bit activations, which QNN's HTP computes imprecisely", Severity.WARNING
        ),
        FindingKind(
            "QNN007", "a quantized ConvTranspose's bias Add, which QNN's HTP computes wrongly", Severity.WARNING
        ),
        FindingKind(
            "QNN008", "a BatchNormalization quantized on its own, which QNN's HTP computes wrongly", Severity.WARNING
        ),
        FindingKind("QNN009", "a lone Q/DQ node that QNN gives back to the CPU EP", Severity.INFO),
        FindingKind(
            "QNN010", "a Clip with bounds computed at run time, which QNN gives back to the CPU EP", Severity.WARNING
        ),
        FindingKind("QNN011", "a shape QNN's EP builds as a Gelu whose constants are not a GELU's: QNN computes a GELU "
                    "there, not the model", Severity.WARNING),
        FindingKind("TRT001", "opset outside what the TensorRT parser documents", Severity.WARNING),
        FindingKind("CMB001", "EPs that cannot share one session", Severity.ERROR),
        # CNV: transforms (convert, simplify, optimize)
        FindingKind("CNV001", "constants beyond FP16's range", Severity.WARNING),
        FindingKind("CNV002", "constants too small for FP16 become zero", Severity.INFO),
        FindingKind("CNV003", "activations beyond FP16's range on the test inputs", Severity.WARNING),
        FindingKind("CNV005", "ONNX Runtime crashed on the converted model", Severity.WARNING),
        FindingKind("CNV006", "verification failed", Severity.ERROR),
        FindingKind(
            "CNV007", "the original does not run, so the result is not verified (and not written)", Severity.ERROR
        ),
        FindingKind("CNV008", "ops kept FP32 because the EP has no FP16 kernel", Severity.INFO),
        FindingKind("CNV009", "verification passed with mixed precision", Severity.INFO),
        FindingKind(
            "CNV010", "ONNX Runtime crashes on some ops in FP16; bisection kept them in FP32", Severity.WARNING
        ),
        FindingKind("CNV011", "onnxconverter-common failed on this model", Severity.ERROR),
        FindingKind("CNV012", "the FP16 model is not smaller", Severity.WARNING),
        FindingKind("CNV013", "constants and BatchNormalization folded before FP16", Severity.INFO),
        FindingKind(
            "CNV015",
            "every output is flat on the inputs ortprep made: nothing verified, nothing written",
            Severity.ERROR,
        ),
        FindingKind("CNV014", "FP16 for no particular EP: the CPU EP runs some ops through Casts", Severity.INFO),
        FindingKind("CNV016", "inputs fixed, but some tensors inside still have unknown dimensions", Severity.WARNING),
        FindingKind(
            "CNV017", "FP16 verified on inputs ortprep made: the real input range is unknown", Severity.WARNING
        ),
        FindingKind("CNV018", "--rewrite-for left nodes the EP does not take as they were", Severity.WARNING),
        FindingKind(
            "CNV019", "the real EP's session leaves nodes a rewrite made on the CPU", Severity.WARNING
        ),
        FindingKind("CNV020", "an input scaled down before FP16, so its activations fit", Severity.INFO),
        FindingKind(
            "VFY001",
            "an output is constant or near zero on the inputs used; judged by absolute error",
            Severity.WARNING,
        ),
        FindingKind(
            "SIM001",
            "a simplifier (onnxsim or onnxoptimizer) could not run; the other's result is used",
            Severity.WARNING,
        ),
        FindingKind("OPT001", "level 'all' output is specific to this machine and the CPU EP", Severity.WARNING),
        FindingKind("OPT002", "ONNX Runtime could not optimize the model", Severity.ERROR),
        # QNT: quantization
        FindingKind("QNT001", "calibration on random data", Severity.WARNING),
        FindingKind("QNT002", "nothing was quantized", Severity.ERROR),
        FindingKind("QNT003", "the quantized model is not smaller", Severity.ERROR),
        FindingKind("QNT004", "the quantized model is slower on this CPU", Severity.WARNING),
        FindingKind("QNT005", "accuracy gate failed", Severity.ERROR),
        FindingKind("QNT006", "nodes kept in float by --auto-exclude", Severity.INFO),
        FindingKind("QNT007", "quantization pre-processing failed", Severity.WARNING),
        FindingKind("QNT008", "ONNX Runtime's quantizer failed", Severity.ERROR),
        FindingKind("QNT009", "weights in Constant nodes moved to initializers", Severity.INFO),
        FindingKind("QNT010", "the model is already quantized", Severity.ERROR),
        FindingKind("QNT011", "evaluated on seeded random inputs: proves little", Severity.WARNING),
        FindingKind("QNT012", "per-channel needs opset 13: upgraded, or per-tensor", Severity.INFO),
        FindingKind("QNT013", "pre-processing made the result worse: not used", Severity.INFO),
        FindingKind(
            "QNT014", "the verdict rests on fewer than 16 evaluation samples (weak evidence)", Severity.WARNING
        ),
        FindingKind("QNT016", "another calibration method measured better and was kept", Severity.INFO),
        FindingKind("QNT017", "--auto: which precision passed, or that none did", Severity.INFO),
        FindingKind("QNT015", "nodes reading non-finite or sentinel constants stay float", Severity.INFO),
        FindingKind("QNT018", "weight-only: the target EP has no MatMulNBits kernel", Severity.WARNING),
        FindingKind("QNT019", "decisions judged on seeded random inputs only: not written", Severity.ERROR),
        FindingKind("QNT020", "weight scales raised where QNN's HTP requantizes a channel wrongly", Severity.INFO),
        FindingKind(
            "QNT021", "the target EP judged fewer samples: one run takes long there (--ep-seconds)", Severity.WARNING
        ),
        FindingKind(
            "QNT022", "nodes kept off the target EP, which computes them otherwise than the CPU EP", Severity.WARNING
        ),
        FindingKind("QNT023", "the step's time on the target EP was spent (--ep-total-seconds)", Severity.WARNING),
        FindingKind("QNT024", "MatMuls of two 16-bit activations computed in FP16 for QNN's HTP", Severity.INFO),
        FindingKind("QNT025", "bias Adds after ConvTranspose folded into its bias for QNN's HTP", Severity.INFO),
        FindingKind("QNT026", "BatchNormalizations after Conv folded into it for QNN's HTP", Severity.INFO),
        FindingKind("QNT027", "most of the result's weights stay float", Severity.WARNING),
        FindingKind("QNT028", "activations given 16 bits by --auto-exclude", Severity.INFO),
        FindingKind(
            "QNT029", "16-bit activations into 8-bit-weight MatMuls: int8 compute on the CPU EP", Severity.WARNING
        ),
        FindingKind("QNT030", "weight-only levels chosen for the MatMuls' outputs (gptq rounding) kept", Severity.INFO),
        FindingKind("QNT031", "weight-only: float32 compute kept over the CPU EP's int8 compute", Severity.INFO),
        FindingKind("QNT032", "passed on an assumed decision the samples leave below its bar (no evidence of a miss)",
                    Severity.INFO),
        FindingKind("QNT040", "the target EP's session failed on a candidate: its culprits kept off the EP, or named",
                    Severity.WARNING),
        FindingKind("QNT033", "judged only on inputs ortprep made up, unasked: not quantized", Severity.ERROR),
        # LOD: the runtime's word (load)
        FindingKind("LOD001", "ORT placed a node differently from check's prediction", Severity.WARNING),
        FindingKind("LOD002", "the EP is not available in this ONNX Runtime", Severity.ERROR),
        FindingKind("LOD003", "the EP's process crashed or hung", Severity.ERROR),
        FindingKind("LOD004", "session creation or the run failed", Severity.ERROR),
        FindingKind("LOD005", "nodes fell back to the CPU", Severity.WARNING),
        FindingKind("LOD006", "outputs differ from the CPU EP's", Severity.ERROR),
        FindingKind("LOD007", "NaN or Inf in outputs", Severity.ERROR),
        FindingKind("LOD008", "the EP rejected a node (its own log names the reason)", Severity.WARNING),
        FindingKind("LOD009", "inputs were guessed and none of the guesses ran", Severity.WARNING),
        FindingKind("LOD010", "outputs that differed match with TF32 off: the difference is TF32's", Severity.INFO),
        FindingKind("LOD011", "the EP asked for runs none of the model, or less than --min-share", Severity.ERROR),
        FindingKind("LOD012", "outputs that differed match with an ORT graph optimization left out: it changes what "
                    "the EP computes", Severity.INFO),
        FindingKind("LOD013", "a name --disable-optimizer gives is not one of ORT's basic-level optimizers ortprep "
                    "knows (ORT ignores a name it does not know)", Severity.WARNING),
        # PRV: proven verdicts (check --prove): the real session's word
        FindingKind("PRV001", "the real session placed nodes otherwise than check predicted", Severity.WARNING),
        FindingKind("PRV002", "the real session is not created on the EP", Severity.ERROR),
        FindingKind("PRV003", "the EP does not run here: the verdict stays a prediction", Severity.INFO),
        FindingKind("PRV004", "the EP runs none of the model, or less than --min-share", Severity.ERROR),
        # CMP: compile (EPContext models)
        FindingKind("CMP001", "compiling, reloading or running the EPContext model failed", Severity.ERROR),
        FindingKind("CMP002", "the compiled model's outputs differ from the source model's", Severity.ERROR),
        FindingKind("CMP003", "nodes stay outside the EPContext nodes", Severity.INFO),
        FindingKind(
            "CMP004", "--eval judged fewer samples: one run takes long on the EP (--ep-seconds)", Severity.WARNING
        ),
        FindingKind(
            "CMP005",
            "initializers read inside If/Loop/Scan bodies were copied into them before compiling",
            Severity.INFO,
        ),
        FindingKind(
            "CMP006",
            "larger initializers read inside If/Loop/Scan bodies were read through main-graph Identity nodes "
            "before compiling",
            Severity.INFO,
        ),
        FindingKind("CMP007", "the EP compiles none of the model, or less than --min-share", Severity.ERROR),
        FindingKind("CMP008", "ORT's compile API wrote a context that computes otherwise; the one a session writes "
                    "with ep.context_enable matches and was written", Severity.INFO),
        # PKG: model packages (package, load --package)
        FindingKind("PKG001", "a target's variant failed its gate: the package is not written", Severity.ERROR),
        FindingKind(
            "PKG002",
            "the target's EP does not run where the package was made: no session proves its variant",
            Severity.WARNING,
        ),
        FindingKind(
            "PKG003",
            "no EPContext model in the package: the EP compiles the QDQ variant at session creation",
            Severity.WARNING,
        ),
        FindingKind("PKG004", "an EP asked for does not run here: no variant was tried on it", Severity.WARNING),
        FindingKind("PKG005", "no variant of the package fits an EP available here", Severity.ERROR),
        # RUN: the command itself
        FindingKind(
            "RUN001",
            "the command stopped before it could report (bad input, missing environment, internal error)",
            Severity.ERROR,
        ),
        # DOC: the machine (doctor); SCN: pitfalls in code (doctor --scan)
        FindingKind("DOC001", "several ONNX Runtime packages installed side by side", Severity.ERROR),
        FindingKind("DOC002", "a CUDA/TensorRT library the EP needs does not load", Severity.ERROR),
        FindingKind("DOC003", "no int8 dot-product instructions on this CPU", Severity.INFO),
        FindingKind("DOC004", "another CUDA context owner next to ORT's GPU EPs", Severity.WARNING),
        FindingKind("DOC005", "ONNX Runtime is not importable", Severity.ERROR),
        FindingKind("SCN001", "pycuda.autoinit in a program using ORT's CUDA/TensorRT EP", Severity.WARNING),
        FindingKind("SCN002", "InferenceSession without providers=", Severity.WARNING),
        FindingKind("SCN003", "EPs that cannot share one session", Severity.ERROR),
        FindingKind("SCN004", "two ONNX Runtime flavours required side by side", Severity.ERROR),
    )
}


@dataclass(frozen=True)
class Finding:
    """One thing a step noticed. ``message`` names the node, op and EP where there are any."""

    code: str
    severity: Severity
    message: str
    node: str | None = None
    op_type: str | None = None
    ep: str | None = None
    fix: str | None = None
    source: str | None = None
    target: str | None = None  # check: the target (one session's EP list) the finding belongs to

    @classmethod
    def of(cls, code: str, message: str, *, severity: Severity | None = None, **fields: str | None) -> "Finding":
        """Build a finding of a catalogued code, with the catalogue's severity unless told otherwise."""
        kind = CATALOGUE[code]
        return cls(code=code, severity=severity or kind.severity, message=message, **fields)

    def to_record(self) -> dict:
        record = asdict(self)
        record["severity"] = self.severity.label
        return record
