"""Judgements in words, for findings: a judged decision, what fails a side of quantize's gate, the
margin a chosen result missed."""

from __future__ import annotations

import math

import numpy as np

from ortprep.fidelity.decisions import REQUIRED, REQUIRED_SEQUENCES, evidence_shares, held_on_evidence, label_of
from ortprep.fidelity.decisions.evidence import CONFIDENCE
from ortprep.fidelity.evaluation import Judgement
from ortprep.fidelity.tolerances import NORM_TOLERANCE

CONFIDENCE_WORDS = f"{CONFIDENCE:.0%}"


def fmt_cosine(value: float | None, against: float | None = None) -> str:
    """A cosine for a message: four decimals (more where ``against``, the gate's threshold, needs
    them: 0.99999997 below a gate of 0.999999999995 is not '1.0000'), or n/a."""
    if value is None:
        return "n/a"
    digits = 4
    if against is not None and 0.0 < 1.0 - against < 1e-4:
        digits = min(12, int(np.ceil(-np.log10(1.0 - against))) + 1)
    return f"{value:.{digits}f}"


def describe_decision(record: dict) -> str:
    """One judged decision in words: what it is, what the candidate kept, what the gate asks, and,
    refused, by which rule and what --metric names instead (rule_words)."""
    return _describe(record) + rule_words(record)


def _describe(record: dict) -> str:
    kind = label_of(record)
    parts = []
    if record.get("agreement") is not None:
        parts.append(f"{record['agreement']:.4f} on the samples")
    if record.get("expected_agreement") is not None:
        parts.append(f"{record['expected_agreement']:.4f} expected on unseen inputs")
    if record.get("strings") is not None and record.get("strings_changed") is not None:
        parts.append(f"{record['strings_changed']} of {record['strings']} decoded strings changed")
    if record.get("sequence_agreement") is not None:
        parts.append(f"whole sequences {record['sequence_agreement']:.4f}")
    required = REQUIRED.get(record["kind"])
    if record.get("error") and record.get("agreement") is None:
        return f"'{record['name']}' ({kind}) cannot be read so: {record['error']}"
    text = f"'{record['name']}' ({kind}) agrees {', '.join(parts) or 'on nothing comparable'}"
    ranking = record.get("ranking") or {}
    if ranking.get("passed") is False and (required is None or (record.get("agreement") or 0.0) >= required):
        # the thresholded scores agree, the row's best-scored class does not
        best = ranking.get("agreement")
        best_expected = ranking.get("expected_agreement")
        return (text + "; but each row's best-scored class agrees "
                + (f"{best:.4f} on the samples" if best is not None else "on nothing comparable")
                + (f", {best_expected:.4f} expected on unseen inputs" if best_expected is not None else "")
                + f", below the {ranking.get('required', 0.99):g} required (--metric {record['name']}=map: the "
                  "threshold alone)")
    confidence = record.get("confidence") or {}
    if confidence.get("passed") is False and (required is None or (record.get("agreement") or 0.0) >= required):
        # the top class agrees, its probability crosses a level an application may accept it at
        if record["kind"] == "ctc":
            return (text + f"; but the lines' scores stay on the same side of {confidence['level']:g} "
                    f"{confidence['agreement']:.4f} of the lines, {confidence['expected_agreement']:.4f} expected on "
                    "unseen "
                    f"inputs, below the {confidence['required']:g} required")
        return (text + f"; but the top class's probability stays on the same side of {confidence['level']:g} "
                f"{confidence['agreement']:.4f} on the samples, {confidence['expected_agreement']:.4f} expected on "
                "unseen "
                f"inputs, below the {confidence['required']:g} required (--metric {record['name']}=top1: the class "
                "alone)")
    scenes = [
        value for value in (record.get("scene_agreement"), record.get("expected_scene_agreement")) if value is not None
    ]
    boxes = record.get("box_agreement")
    if record["kind"] == "detect" and boxes is not None and boxes < record.get("required_regions", 0.0) and (
            required is None or (record.get("agreement") or 0.0) >= required):
        # the detections agree, their boxes moved
        return text + (f"; but of the detections both find, {boxes:.4f} keep their box within {record['box_slack']:g} "
                       "px, "
                       f"below the {record['required_regions']:g} required")
    if record["kind"] == "detect" and scenes and min(scenes) < record.get("required_scenes", 0.0) and (
            required is None or (record.get("agreement") or 0.0) >= required):
        # the detections agree, whole scenes do not (or would not on unseen inputs)
        def share(key: str) -> str:
            return "n/a" if record.get(key) is None else f"{record[key]:.4f}"

        return text + (f"; but whole scenes keep every detection {share('scene_agreement')} on the samples, "
                       f"{share('expected_scene_agreement')} expected on unseen inputs, below the "
                       f"{record['required_scenes']:g} required")
    if record["kind"] == "dfl" and (record.get("largest_move_bins") or 0.0) > record.get("limit_bins", float("inf")):
        return text + (f"; but a box side moves {record['largest_move_bins']:.2f} bins, past the "
                       f"{record['limit_bins']:g} allowed")
    regions = record.get("region_agreement")
    if regions is not None and regions < record.get("required_regions", 0.0):
        # the map's elements agree but its regions' boxes move: say that, not the F1
        counted = (f" ({record['regions_kept']} of the float map's {record['regions']})"
                   if record.get("regions") is not None else "")
        return (text + f"; its regions above {record['region_level']:g} keep their boxes {regions:.4f}{counted}, below "
                f"the {record['required_regions']:g} required")
    return text + (f", below the {required:g} required" if required is not None else "")


def decision_text(decision: dict) -> str:
    """One judged decision in words for quantize's findings: what the candidate keeps of what the
    application reads, against the share the gate asks, and, where it falls short, by what and by
    which rule (rule_words)."""
    return _decision_text(decision) + rule_words(decision)


def _share_words(share: dict) -> str:
    """An evidence-judged share in words: its count, its upper bound, what is expected."""
    units = share["units"]
    kept = f"{round(share['share'] * units)} of {units}" if units else f"{share['share']:.1%}"
    text = (f"{share['what']} {kept} on the samples ({share['share']:.1%}; at most {share['upper']:.1%} at "
            f"{CONFIDENCE_WORDS} confidence)")
    if share.get("expected") is not None:
        text += f", {share['expected']:.1%} expected on unseen inputs"
        if share.get("expected_upper") is not None and share["expected"] < share["required"]:
            text += (f" (from the margins of {share['expected_units']} float decisions: at most "
                     f"{share['expected_upper']:.1%} at {CONFIDENCE_WORDS} confidence)")
    return text + f", the gate asks {share['required']:.0%}"


def rule_words(decision: dict) -> str:
    """What a refused decision was refused by, under which rule, what it assumed and the --metric
    that confirms or replaces the assumption; empty where it passed or nothing was assumed."""
    if decision.get("passed") is not False:
        return ""
    name = decision.get("name") or "OUTPUT"
    refused = ", ".join(decision.get("refused_by") or [])
    if decision.get("rule") != "evidence":
        return f" [refused by the exact rule of --metric {name}={label_of(decision)}: {refused}]" if refused else ""
    shares = [share for share in evidence_shares(decision) if share["upper"] < share["required"]
              or (share.get("expected") is not None and share["expected"] < share["required"])]
    shares = shares or evidence_shares(decision)[:1]
    figures = "; ".join(_share_words(share) for share in shares)
    text = f" [refused by the evidence rule: {refused}" + (f" ({figures})" if figures else "")
    if decision.get("assumptions"):
        text += "; assumed: " + "; ".join(decision["assumptions"])
    if decision.get("confirm_with"):
        text += "; confirm or replace with " + " or ".join(f"--metric {name}={value}"
                                                          for value in decision["confirm_with"])
    return text + "]"


def assumption_words(decision: dict) -> str | None:
    """A passing decision that rests on the evidence rule (a share below its bar on the samples, no
    evidence of a miss) in words: its assumptions, its figures, the --metric that confirms or
    replaces them; None where the exact rule would have passed it too."""
    held = held_on_evidence(decision)
    if not held:
        return None
    name = decision.get("name") or "OUTPUT"
    text = (f"output '{name}' ({label_of(decision)}): assumed: " + "; ".join(decision.get("assumptions") or [])
            + "; held on the evidence rule: " + "; ".join(_share_words(share) for share in held)
            + ": the samples are no evidence that the bar is missed")
    if decision.get("confirm_with"):
        text += "; confirm or replace with " + " or ".join(f"--metric {name}={value}"
                                                          for value in decision["confirm_with"])
    return text


def _decision_text(decision: dict) -> str:
    what = {
        "top1": "its top-1 class agrees with the float model's on",
        "argmax": "its argmax per position agrees on",
        "ctc": "its decoded strings (greedy CTC) equal the float model's on",
        "map": f"its map above {decision.get('threshold')} matches the float model's with F1",
        "detect": f"its detections (class scores above {decision.get('threshold')}) match the float model's with F1",
        "dfl": f"its box sides (decoded as DFL distances) stay within {decision.get('slack_bins')} bins of the "
        "float "
        "model's on",
    }[decision["kind"]]
    share, expected, required = decision["agreement"], decision.get("expected_agreement"), decision.get("required")
    if share is None:
        return f"{what} n/a ({decision.get('error') or 'nothing to compare'})"
    text = f"{what} {share:.1%}" + (f" (the gate asks {required:.0%})" if required else "")
    whole, whole_expected = decision.get("sequence_agreement"), decision.get("expected_sequence_agreement")
    if decision["kind"] == "argmax" and share is not None and (required is None or share >= required) and (
            (whole is not None and whole < REQUIRED_SEQUENCES)
            or (whole_expected is not None and whole_expected < REQUIRED_SEQUENCES)):
        # each position nearly always agrees, whole sequences (the string the application reads) do not
        def share_text(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1%}"

        return (text + f"; whole sequences agree on {share_text(whole)} of these samples and on about "
                f"{share_text(whole_expected)} to expect on unseen ones (the gate asks {REQUIRED_SEQUENCES:.0%}: a "
                "string "
                "is right only when every position is)")
    ranking = decision.get("ranking") or {}
    if decision["kind"] == "map" and required and ranking.get("passed") is False and (
            share is not None and share >= required and (expected is None or expected >= required)):
        # the thresholded scores agree, the row's best-scored class (what a ranking reads) does not
        best, best_expected = ranking.get("agreement"), ranking.get("expected_agreement")
        text += (f"; but each row's best-scored class (what an application that ranks the scores reads) agrees on "
                 f"{'n/a' if best is None else f'{best:.1%}'} of these samples and about "
                 f"{'n/a' if best_expected is None else f'{best_expected:.1%}'} to expect on unseen ones "
                 f"(the gate asks {ranking.get('required', 0.99):.0%}; --metric OUTPUT=map judges the threshold alone)")
        return text
    confidence = decision.get("confidence") or {}
    if decision["kind"] in ("ctc", "top1") and required and confidence.get("passed") is False and (
            share is not None and share >= required and (expected is None or expected >= required)):
        # the decision agrees, a score crosses a level an application may accept (or drop) it at
        what, why = ({"ctc": ("the lines' scores (the mean top probability over the characters read) stay",
                              "an application drops a line below a score of its own, rapidocr at 0.5"),
                      "top1": ("the top class's probability stays",
                               "an application that accepts a class above a threshold answers otherwise; "
                               f"--metric {decision.get('name') or 'OUTPUT'}=top1 judges the class alone")}
                     )[decision["kind"]]
        return (text + f"; but {what} on the same side of {confidence['level']:g} on "
                f"{confidence['agreement']:.1%} of these samples and about {confidence['expected_agreement']:.1%} to "
                f"expect on unseen ones (the gate asks {confidence['required']:.0%}: {why})")
    boxes, needed = decision.get("box_agreement"), decision.get("required_regions")
    if decision["kind"] == "detect" and boxes is not None and needed is not None and boxes < needed and (
            required is None or share >= required):
        # the detections agree, their boxes moved
        return (text + f"; but of the {decision.get('detections_kept')} detections both keep, {boxes:.1%} keep their "
                       "box "
                f"within {decision.get('box_slack'):g} px (the gate asks {needed:.0%})")
    scenes, scenes_expected = decision.get("scene_agreement"), decision.get("expected_scene_agreement")
    needed = decision.get("required_scenes")
    if decision["kind"] == "detect" and needed is not None and (required is None or share >= required):
        # the detections pooled agree, whole scenes (what the application returns per input) do not
        if scenes is not None and scenes < needed:
            kept = decision.get("detections_kept") or 0
            moved = kept - round((decision.get("box_agreement") or 0.0) * kept)
            return (text + f"; but only {scenes:.1%} of these samples keep every detection (the gate asks "
                           f"{needed:.0%}: "
                    f"a scene is right only when all its detections are; {decision.get('detections_lost')} lost, "
                    f"{decision.get('detections_added')} added, {moved} box(es) moved past "
                    f"{decision.get('box_slack'):g} px)")
        if scenes_expected is not None and scenes_expected < needed:
            return (text + f"; but only about {scenes_expected:.1%} of unseen scenes can be expected to keep every "
                    f"detection (the gate asks {needed:.0%}): the float model's scenes hold scores nearer "
                    f"{decision.get('threshold')} than the candidate moves them")
    regions, needed = decision.get("region_agreement"), decision.get("required_regions")
    if decision["kind"] == "map" and regions is not None and needed is not None and regions < needed and (
            required is None or (share is not None and share >= required)):
        # the pixels agree, the regions an application boxes do not
        counted = (f", {decision['regions_kept']} of the float map's {decision['regions']} boxes kept"
                   if decision.get("regions") is not None else "")
        if decision.get("exact_boxes") or decision.get("region_match", "identical boxes") == "identical boxes":
            return (text + f"; but its regions above {decision.get('region_level'):g} keep their bounding box on only "
                    f"{regions:.1%}{counted} (the gate asks {needed:.0%}: a box one pixel off is another crop)")
        return (text + f"; but its regions above {decision.get('region_level'):g} are kept (a region of the other "
                f"map over the box at {decision['region_match']}) on only {regions:.1%}{counted} (the gate asks "
                f"{needed:.0%}: a line split, merged or lost is another crop)")
    largest, limit = decision.get("largest_move_bins"), decision.get("limit_bins")
    if decision["kind"] == "dfl" and largest is not None and limit is not None and largest > limit:
        return text + f"; but a side moves {largest:.2f} bins, past the {limit:g} allowed (a whole bin is another box)"
    if required and share is not None and share >= required and expected is not None and expected < required:
        # the samples agreed, their margins say unseen ones will not
        text += (f" on these samples, but only about {expected:.1%} to expect on unseen ones: the float model's "
                 "decisions sit closer to their boundary than the quantization error moves them")
    return text


def shortfall_text(judgement, min_cosine: float) -> str:
    """What fails on one side, worst output first: its cosine, or its size (the norm ratio)."""
    failing = judgement.failing()
    apart = judgement.apart
    if not failing and apart:
        size = "" if apart["max_abs_diff"] is None else f"max abs diff {apart['max_abs_diff']:.4g}, "
        allowed = "" if apart["tolerance"] is None else f"allowed {apart['tolerance']:.4g}: "
        if (apart.get("tolerance") is not None and apart.get("max_abs_diff") is not None
                and apart["max_abs_diff"] <= apart["tolerance"] and apart.get("norm_ratio") is not None):
            # within the max abs diff: the norm is what fails, and the words say so
            size = (f"norm ratio {apart['norm_ratio']:.4f}, outside the 1 ± {NORM_TOLERANCE:g} asked; "
                    f"max abs diff {apart['max_abs_diff']:.4g}, ")
        return (f"output '{apart['name']}' computed otherwise than the CPU EP computes the same model, beyond what "
                "load "
                f"and compile allow (held-back sample {apart['sample']}: {size}{allowed}{apart['tolerance_rule']}) "
                "though "
                f"its cosine against the float model passes ({fmt_cosine(judgement.cosine)})"
                + (f"; {apart['hint']}" if apart.get("hint") else ""))
    if not failing:
        return f"lowest cosine {fmt_cosine(judgement.cosine)}"
    worst = min(failing, key=lambda o: (o["cosine"] if o["cosine"] is not None else -2.0))
    name, cosine, ratio = worst["name"], worst["cosine"], worst["norm_ratio"]
    decision = worst.get("decision") or {}
    if worst["judged_by"] != "cosine":
        text = f"output '{name}' off by {worst['max_abs_diff']:.4g} ({worst['judged_by']})"
    elif (
        decision
        and decision.get("passed") is False
        and cosine is not None
        and (cosine >= min_cosine or decision.get("replaces_cosine"))
        and (ratio is None or abs(ratio - 1.0) <= NORM_TOLERANCE)
    ):
        text = (f"output '{name}' decides otherwise: {decision_text(decision)} (cosine {fmt_cosine(cosine)} passes: "
                "the tensor is close, the application's answer is not)")
    elif tail_only(worst, min_cosine):
        text = tail_text(name, cosine, worst["cosine_expected"], min_cosine)
    elif cosine is not None and (cosine >= min_cosine or decision.get("replaces_cosine")) and ratio is not None:
        text = (f"output '{name}' scaled as a whole: norm ratio {ratio:.4f}, allowed 1 ± {NORM_TOLERANCE:g} "
                f"(cosine {fmt_cosine(cosine)}: the direction is right, the size is not)")
    else:
        asked = f"{min_cosine:g}" if 1.0 - min_cosine >= 1e-4 else fmt_cosine(min_cosine, min_cosine)
        text = (f"cosine {fmt_cosine(cosine, min_cosine)} on output '{name}' (the gate asks {asked}"
                + (f"; norm ratio {ratio:.4f})" if ratio is not None else ")"))
        if decision and decision.get("agreement") is not None and decision["agreement"] < 1.0:
            text += f"; {decision_text(decision)}"
    if len(failing) > 1:
        text += f"; {len(failing) - 1} more output(s) fail"
    return text


def tail_only(output: dict, min_cosine: float) -> bool:
    """Whether an output's record fails on the share of unseen inputs its samples' spread expects
    at the floor alone (fidelity/cosine_tail.py): every sample keeps the floor and the norm."""
    expected, cosine, ratio = output.get("cosine_expected"), output.get("cosine"), output.get("norm_ratio")
    return (bool(expected) and expected["share"] < expected["asks"] and cosine is not None and cosine >= min_cosine
            and (ratio is None or abs(ratio - 1.0) <= NORM_TOLERANCE))


def tail_text(name: str, cosine: float, expected: dict, min_cosine: float) -> str:
    """An output whose samples all keep the cosine floor, too close to it for unseen inputs to
    (fidelity/cosine_tail.py)."""
    share = math.floor(expected["share"] * 1000) / 10  # rounded down: 98.99% is not 99.0%
    return (f"output '{name}': each of its {expected['samples']} samples keeps cosine {min_cosine:g} (lowest "
            f"{fmt_cosine(cosine)}), but their spread expects only {share:.1f}% of unseen inputs to (the gate asks "
            f"{expected['asks']:.0%})")


def failing_words(evaluation, min_cosine: float) -> str | None:
    """What fails the gate, in a few words, the side first: the CPU EP's held-back samples, the
    target EP's, then the calibration samples (the confirmation); None where it passes."""
    if evaluation.passed:
        return None
    if evaluation.error is not None:
        return evaluation.error
    if not evaluation.cpu_verdict:
        cpu = Judgement("cpu", evaluation.cosine, evaluation.norm_ratio, evaluation.max_abs_diff, None, False,
                        evaluation.outputs)
        return f"on the CPU EP: {shortfall_text(cpu, min_cosine)}"
    on_ep = evaluation.on_ep
    if on_ep is not None and not on_ep.passed:
        return f"on {on_ep.ep}: {on_ep.error or shortfall_text(on_ep, min_cosine)}"
    confirmation = evaluation.confirmation
    side = confirmation.failing if confirmation is not None else None
    if side is not None:
        where = "the CPU EP" if side.ep == "cpu" else side.ep
        return (f"with the samples it was calibrated on, on {where}: "
                f"{side.error or shortfall_text(side, min_cosine)}")
    return None


def selection_words(selection: dict, ep_text: str) -> str:
    """What the decision margin found short (hold_to_margin), in a few words."""
    where = "the CPU EP" if selection["side"] == "cpu" else ep_text
    gate = 2 * selection["asked"] - 1  # with_margin, undone
    return (f"output '{selection['output']}' ({selection['kind']}): {selection['share']} {selection['measured']:.1%} "
            "on "
            f"{where}'s {selection['samples']} held-back samples passes the gate ({gate:.1%}) but not "
            f"{selection['asked']:.1%}, the margin asked of a result chosen among {selection['trials']} trials judged "
            "on "
            "those same samples (half-way from the gate to 1: of several trials, they favour the one they chose)")

