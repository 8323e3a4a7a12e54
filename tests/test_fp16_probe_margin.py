"""fp16_probe.held_to_aim: FP16 named after --auto's attempts failed is held to the cosine aim
on an output no decision reads; an output whose gated decision holds is held to that decision and
to --min-cosine, not to a cosine aim nobody named
(docs/decisions/gate-fp16-probe-margin.md). Evaluations are read duck-typed, as quantize's gate
writes them."""

from types import SimpleNamespace

from ortprep.steps.quantize.fp16_probe import held_to_aim

AIM = 0.995  # margin_aim(0.99)


def judged(outputs, ep_outputs=None, calibration=None):
    on_ep = SimpleNamespace(ep="qnn", outputs=ep_outputs, passed=True) if ep_outputs else None
    confirmation = (SimpleNamespace(cpu=SimpleNamespace(ep="cpu", outputs=calibration, passed=True), on_ep=None)
                    if calibration else None)
    return SimpleNamespace(passed=True, cpu_passed=None, outputs=outputs, on_ep=on_ep, confirmation=confirmation)


def output(name, cosine, decision=None):
    return {"name": name, "cosine": cosine, "judged_by": "cosine", "decision": decision}


def score_map(agreement, expected):
    return {"kind": "map", "passed": True, "required": 0.98, "agreement": agreement, "expected_agreement": expected}


def test_an_output_whose_decision_holds_with_the_margin_is_not_held_to_the_cosine_aim():
    # the layout detector's FP16 on QNN (journey layout_cdla, session 35): every map and box decision
    # kept, one score map at cosine 0.9943 where the aim is 0.995
    evaluation = judged([output("scores", 0.9990, score_map(1.0, 1.0))],
                        [output("scores", 0.9943, score_map(1.0, 0.9952))])
    assert held_to_aim(evaluation, AIM) is None and evaluation.passed is True


def test_an_output_no_decision_reads_is_held_to_the_cosine_aim():
    evaluation = judged([output("scores", 0.9990, score_map(1.0, 1.0)), output("embedding", 0.9960)],
                        [output("scores", 0.9990, score_map(1.0, 1.0)), output("embedding", 0.9943)])
    words = held_to_aim(evaluation, AIM)
    assert evaluation.passed is False
    assert words.startswith("on qnn: cosine 0.9943 on output 'embedding', which no decision reads")
    # the EP's side alone falls short: the CPU EP's verdict stays a pass (QNT017 reads ep_only)
    assert evaluation.cpu_passed is True and evaluation.on_ep.passed is False


def test_the_calibration_samples_are_held_to_the_cosine_aim_too():
    evaluation = judged([output("embedding", 0.9990)], calibration=[output("embedding", 0.9930)])
    words = held_to_aim(evaluation, AIM)
    assert evaluation.passed is False and evaluation.confirmation.cpu.passed is False
    assert words.startswith("with the samples it was calibrated on, on the CPU EP: cosine 0.9930")


def test_a_failed_evaluation_is_left_as_it_is():
    evaluation = judged([output("embedding", 0.90)])
    evaluation.passed = False
    assert held_to_aim(evaluation, AIM) is None and evaluation.passed is False
