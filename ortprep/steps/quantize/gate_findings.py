"""The findings of quantize's gate: QNT005 (the gate failed: where, by what, and what to do), QNT004
(slower than the float model), QNT021 (the target EP judged fewer samples than offered), QNT032 (it
passed on an assumed decision that the samples alone leave below its bar: the evidence rule)."""

from __future__ import annotations

from ortprep.findings import Finding
from ortprep.fidelity.evaluation import CONFIRM_EP_SAMPLES, Evaluation, Judgement
from ortprep.fidelity.words import assumption_words, fmt_cosine, selection_words, shortfall_text, tail_only


def assumption_finding(evaluation: Evaluation | None) -> Finding | None:
    """QNT032 where the result passed and a decision nobody named (inferred from an output's form,
    or a level assumed for it) holds only by the evidence rule: on the samples a share is below its
    bar, but they are no evidence that it is missed (fidelity/decisions/evidence.py). Says what was
    assumed, the figures, and the --metric that confirms or replaces the assumption."""
    if evaluation is None or not evaluation.passed:
        return None
    sides = [("the CPU EP", evaluation.outputs)]
    if evaluation.on_ep is not None:
        sides.append((evaluation.on_ep.ep, evaluation.on_ep.outputs))
    said: list[str] = []
    for where, outputs in sides:
        for output in outputs:
            words = assumption_words({"name": output["name"], **(output.get("decision") or {"kind": "cosine"})})
            if words is not None:
                said.append(f"on {where}, {words}")
    if not said:
        return None
    return Finding.of("QNT032", "written on evidence, with assumptions: " + "; ".join(said[:4])
                      + (f"; {len(said) - 4} more" if len(said) > 4 else ""),
                      fix="name the decision the application reads (--metric OUTPUT=KIND[:VALUE], as above): a named "
                          "decision is held to its bar exactly; more held-back samples (--eval DATA) settle it too")


def limited_finding(evaluation: Evaluation | None) -> Finding | None:
    """QNT021 where the target EP judged fewer samples than offered (--ep-seconds: one run takes
    long there, runtime/budget.py), on the held-back samples or on the calibration samples."""
    from ortprep.runtime.budget import limited_words

    if evaluation is None:
        return None
    sides = [("held-back", evaluation.on_ep)]
    if evaluation.confirmation is not None:
        sides.append(("calibration", evaluation.confirmation.on_ep))
    said = [f"{limited_words(side.limited)} of the {which} ones" for which, side in sides
            if side is not None and side.limited]
    if not said:
        return None
    ep = next(side.limited["ep"] for _, side in sides if side is not None and side.limited)
    return Finding.of("QNT021", f"the gate on {ep} judged {'; '.join(said)}; the CPU EP judged every sample",
                      ep=ep,
                      fix="--ep-seconds N lets the EP judge more samples; on the device itself one run takes "
                          "milliseconds")


def latency_finding(evaluation: Evaluation | None) -> Finding | None:
    """QNT004 when the quantized model ran slower than the float one on the target EP where it was
    timed there, else on this CPU."""
    timed = evaluation.ep_latency if evaluation is not None else None
    if timed and timed.get("ratio") is not None:
        if timed["ratio"] <= 1.0:
            return None
        return Finding.of(
            "QNT004",
            f"the quantized model is slower than the float one on {timed['ep']} "
            f"({timed['quant_ms']:.3f} ms vs {timed['float_ms']:.3f} ms per run, {timed['ratio']:.2f}x)",
            fix="keep the float model for speed on this EP; the precision is a trade of size or accuracy, "
            "not time here",
        )
    if evaluation is None or evaluation.latency_ratio is None or evaluation.latency_ratio <= 1.0:
        return None
    return Finding.of(
        "QNT004",
        f"the quantized model is slower than the float one on this CPU "
        f"({evaluation.quant_latency_ms:.3f} ms vs {evaluation.float_latency_ms:.3f} ms per run)",
        fix="expected without VNNI/AVX-512 int8 kernels, for tiny models, or with ConvInteger; "
        "measure on the target EP",
    )


def gate_finding(evaluation: Evaluation, *, min_cosine: float, ep_text: str, stopped: str, worst: str,
                 writers: str, others: list[str] | None = None, searched: bool = False) -> Finding:
    """QNT005: what failed the gate, where (the CPU EP, the target EP, both) and what to do.
    ``ep_text`` names the EP and its device; ``worst`` the nodes where the CPU-side error starts;
    ``writers`` what writes the outputs the EP alone gets wrong; ``others`` the precisions --auto
    would try after this one, for this target and data (none: FP16 is named); ``searched``: the
    search already ran (--auto-exclude was given), so the fix does not ask for it again."""
    # what the fix offers for the search: to run it, or where it ran, more room for it
    search = ("more room for the search (--search-seconds, --max-float-share, --max-exclude-rounds; it ran)"
              if searched else "--auto-exclude")
    on_ep = evaluation.on_ep
    confirmation = evaluation.confirmation
    selection = evaluation.selection
    if (selection is not None and not selection["passed"] and evaluation.cpu_verdict and (on_ep is None or on_ep.passed)
            and (confirmation is None or confirmation.passed)):
        return Finding.of(
            "QNT005", f"accuracy gate failed by its margin: {selection_words(selection, ep_text)}{stopped}",
            ep=selection["side"] if selection["side"] != "cpu" else None,
            fix="more held-back samples (--eval DATA with more inputs, --samples N) judge a choice more surely; "
                f"ortprep quantize ... --auto (a wider precision) or {search}; verify.gate.selection in the JSON gives "
                "the figures")
    if (evaluation.error is None and confirmation is not None and confirmation.failing is not None
            and evaluation.cpu_verdict and (on_ep is None or on_ep.passed)):
        side = confirmation.failing
        where = "the CPU EP" if side.ep == "cpu" else ep_text
        what = side.error or shortfall_text(side, min_cosine)
        judged = confirmation.held_back + (confirmation.samples if side.ep == "cpu"
                                           else min(confirmation.samples, CONFIRM_EP_SAMPLES))
        spread_only = bool(side.failing()) and all(tail_only(o, min_cosine) for o in side.failing())
        why = ("more samples show a spread that reaches the floor on unseen inputs, though each of them keeps it"
               if spread_only else "the held-back samples miss inputs that the calibration samples show")
        return Finding.of(
            "QNT005", f"accuracy gate failed with the samples it was calibrated on: its {confirmation.held_back} "
                      "held-back "
            f"sample(s) pass, but on {where} the {judged} held-back and calibration samples together give {what}: "
            f"{why}{stopped}",
            ep=side.ep if side.ep != "cpu" else None,
            fix=f"ortprep quantize ... --auto (a wider precision) or {search}"
                + ("" if spread_only else " (it works on the sample that fails worst)")
                + "; verify.confirmation in the JSON gives the figures per output")
    if evaluation.error is not None:
        return Finding.of("QNT005", f"accuracy gate failed: {evaluation.error}{stopped}",
                          fix="check that the float and the quantized model run: ortprep load MODEL --ep cpu")
    if on_ep is not None and on_ep.error is not None:
        cpu = "passes on the CPU EP" if evaluation.cpu_verdict else "fails on the CPU EP too"
        return Finding.of(
            "QNT005", f"accuracy gate failed: the quantized model {cpu} (cosine {fmt_cosine(evaluation.cosine)}) but "
                      "gives "
            f"no outputs on {ep_text}: {on_ep.error}{stopped}", ep=on_ep.ep,
            fix=f"ortprep check MODEL.int8.onnx --ep {on_ep.ep} --prove names what the EP refuses; another --device; "
                "--gate-on-cpu judges on the CPU EP only")
    if evaluation.ep_only:
        cpu = f"cosine {fmt_cosine(evaluation.cosine)}" + (f", norm ratio {evaluation.norm_ratio:.4f}"
                                                            if evaluation.norm_ratio is not None else "")
        return Finding.of(
            "QNT005", f"accuracy gate failed on {ep_text}: it passes on the CPU EP ({cpu}) but {on_ep.ep} gives "
            f"{shortfall_text(on_ep, min_cosine)}: the EP's own error, not quantization's{stopped}"
            + (f"; {writers}" if writers else ""), ep=on_ep.ep,
            fix=f"ortprep quantize ... {search} (its trials are judged on {on_ep.ep} too), a different --device, or "
                "keep the nodes that write that output in float (--exclude-node NAME); ortprep load MODEL.int8.onnx "
                "--ep "
                f"{on_ep.ep} --reference MODEL.onnx separates the EP's error from quantization's; --gate-on-cpu judges "
                "on "
                "the CPU EP only")
    below = [o for o in evaluation.outputs if not o.get("passed", True) and o["judged_by"] == "cosine"
             and not o.get("cosine_replaced_by") and (o["cosine"] is None or o["cosine"] < min_cosine)]
    if below or evaluation.cpu_verdict:
        what = f"lowest output cosine {fmt_cosine(evaluation.cosine)} is below {min_cosine}"
    else:  # scaled, or a flat output off by too much
        what = shortfall_text(
            Judgement(
                "cpu",
                evaluation.cosine,
                evaluation.norm_ratio,
                evaluation.max_abs_diff,
                None,
                False,
                evaluation.outputs,
            ),
            min_cosine,
        )
    if on_ep is not None:
        what += (f"; on {on_ep.ep}: " + (shortfall_text(on_ep, min_cosine) if not on_ep.passed
                                         else f"passes (cosine {fmt_cosine(on_ep.cosine)})"))
    return Finding.of("QNT005", f"accuracy gate failed: {what}{stopped}; worst nodes: {worst}"
                      + (f"; {writers}" if writers else ""),
                      fix=f"ortprep quantize ... {search}" + (", or --exclude-node NAME for the nodes above"
                                                               if worst != "none found" else "")
                          + (f"; --auto tries {', '.join(others)} and keeps the first that passes (where none does, it "
                             "measures FP16 by this gate)" if others
                             else "; no other precision here for --auto to try (--auto measures FP16 by this gate): "
                                  "ortprep convert MODEL --fp16 keeps float arithmetic (verified)"))
