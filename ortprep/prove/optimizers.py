"""Which of ONNX Runtime's graph optimizations makes an EP compute a model otherwise (``load``,
where the EP's outputs differ from the CPU EP's beyond load's rule).

ORT rewrites the graph before the EP sees it (at the basic level for every EP: Conv+Add fused into
one Conv, Erf patterns into Gelu, ...), and an EP may compute the rewritten graph less closely than
the file as written: QNN's HTP does so in FP16 on a text detector (docs/decisions/reduce-ort-optimizers.md).
:func:`find_optimizers` measures it: the same session with the optimizations off; where that
matches, the basic level's optimizers left out in halves, down to the smallest set measured to
match. ORT ignores a name it does not know, so a name is reported only once a session without it
matched; the search never guesses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# ORT's basic-level (level 1) rewrite rules, then its level-1 transformers, by the names
# SessionOptions' disabled optimizers take (each rule's or transformer's own name, which is not
# always its class's: UnsqueezeElimination is "EliminateUnsqueeze", PadFusion "Pad_Fusion"):
# onnxruntime/core/optimizer/graph_transformer_utils.cc (GenerateRewriteRules and
# GenerateTransformers, TransformerLevel::Level1) and each one's header, read 2026-12-07 at ORT's
# main branch. A name an older ORT lacks is ignored by it, which the search allows for.
BASIC_OPTIMIZERS: tuple[str, ...] = (
    "EliminateIdentity", "EliminateSlice", "EliminateUnsqueeze", "EliminateDropout", "ExpandElimination",
    "CastElimination", "PreShapeNodeElimination", "NoopElimination", "DivMulFusion", "FuseReluClip",
    "GemmSumFusion", "GemmTransposeFusion", "NotWhereFusion", "ConvAddFusion", "ConvMulFusion", "ConvBNFusion",
    "Pad_Fusion", "MatMul_BatchNormalization_Fusion", "LabelEncoderFusion",
    "DoubleQDQPairsRemover", "ConstantSharing", "CommonSubexpressionElimination", "ConstantFolding",
    "MatMulAddFusion", "ReshapeFusion", "GeluFusion", "LayerNormFusion", "QDQPropagationTransformer",
    "WeightBiasQuantization", "TransposeOptimizer",
)
# EP sessions the search may build (the session with optimizations off included): a halving over
# BASIC_OPTIMIZERS (30 names) needs at most 2 per halving, 5 halvings, after those two.
MAX_SESSIONS = 12
# No session of the search starts after this many seconds (the first, with the optimizations off,
# always runs): on a simulator a large model's session takes a minute.
MAX_SECONDS = 300.0
# A fix names at most this many optimizers; a larger set measured to match is reported as "off".
NAMED_AT_MOST = 3

# judge(level, disabled optimizers) -> (matched: True/False, or None where the session failed or
# the EP took none of the model; the largest absolute difference, or None)
Judge = Callable[[str, tuple[str, ...]], tuple[bool | None, float | None]]


def find_optimizers(judge: Judge, limit: int = MAX_SESSIONS, seconds: float = MAX_SECONDS) -> dict[str, Any]:
    """What makes the EP's outputs match, measured by ``judge`` in at most ``limit`` sessions and,
    after the first, none started past ``seconds``: ``off_matches`` (the optimizations off),
    ``optimizers`` (the smallest set of basic-level optimizers measured to match when left out
    alone, at the default level; None where none was), ``trials`` (each session: level, disabled,
    matched, max_abs_diff), ``stopped`` (why the halving stopped early, or None)."""
    trials: list[dict[str, Any]] = []
    started = time.monotonic()

    def room() -> bool:
        return len(trials) < limit and time.monotonic() - started < seconds

    def attempt(level: str, disabled: list[str]) -> bool:
        matched, worst = judge(level, tuple(disabled))
        trials.append({"level": level, "disabled": list(disabled), "matched": matched,
                       "max_abs_diff": None if worst is None else float(worst)})
        return matched is True

    result: dict[str, Any] = {"off_matches": attempt("off", []), "optimizers": None, "trials": trials,
                              "stopped": None}
    if not result["off_matches"]:
        return result
    if not room():
        result["stopped"] = "the bound (sessions or seconds) was reached"
        return result
    candidates = list(BASIC_OPTIMIZERS)
    if not attempt("default", candidates):
        return result  # beyond the basic level's optimizers, or several levels together
    result["optimizers"] = candidates
    while len(candidates) > 1:
        if not room():
            result["stopped"] = "the bound (sessions or seconds) was reached"
            break
        half, rest = candidates[: len(candidates) // 2], candidates[len(candidates) // 2:]
        if attempt("default", half):
            candidates = half
        elif not room():
            result["stopped"] = "the bound (sessions or seconds) was reached"
            break
        elif attempt("default", rest):
            candidates = rest
        else:
            break  # neither half alone: the smallest set measured stays the answer
        result["optimizers"] = candidates
    return result


def matched_trial(result: dict[str, Any], wanted: list[str] | None) -> dict[str, Any] | None:
    """The session that measured ``wanted`` left out (None: the session with the optimizations
    off), where it matched."""
    for trial in reversed(result["trials"]):
        if trial["matched"] and (wanted is None and trial["level"] == "off"
                                 or wanted is not None and trial["disabled"] == wanted and trial["level"] == "default"):
            return trial
    return None


def described(ep: str, result: dict[str, Any], default_max: float | None) -> tuple[str, str] | None:
    """(what, fix) of the finding that names what gets past the difference; None where nothing
    measured matched."""
    names = result.get("optimizers")
    named = bool(names) and len(names) <= NAMED_AT_MOST
    trial = matched_trial(result, names if named else None)
    if trial is None:
        return None
    was = f", {default_max:.3g} at ORT's default" if default_max is not None else ""
    diff = f"max abs diff {trial['max_abs_diff']:.3g}{was}" if trial["max_abs_diff"] is not None else "measured"
    if named:
        listed = ", ".join(names)
        what = (f"{ep}: ORT's graph optimization {listed} changes what {ep} computes: with it left out, the "
                f"outputs match the CPU EP's by load's rule ({diff})")
        python = ", ".join(repr(n) for n in names)
        fix = (f"create the application's session without it (Python: InferenceSession(..., "
               f"disabled_optimizers=[{python}])) or with graph_optimization_level ORT_DISABLE_ALL; "
               f"ortprep load MODEL --ep {ep} " + " ".join(f"--disable-optimizer {n}" for n in names)
               + " judges that session")
        return what, fix
    what = (f"{ep}: ORT's graph optimizations change what {ep} computes: with them off, the outputs match "
            f"the CPU EP's by load's rule ({diff})")
    fix = (f"create the application's session with graph_optimization_level ORT_DISABLE_ALL; ortprep load MODEL "
           f"--ep {ep} --optimization off judges that session")
    return what, fix
