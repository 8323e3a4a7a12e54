"""The reduction engine (ortprep/prove/reduction.py) on plain predicates: bisection, the shortest
window, ddmin and the budget, without sessions."""

from __future__ import annotations

import time

import pytest

from ortprep.prove.reduction import Budget, Stopped, ddmin, doubling, first_true, last_true, shortest_window


def counted(predicate):
    calls: list = []

    def probe(value):
        calls.append(value)
        return predicate(value)

    return probe, calls


def test_first_true_finds_the_smallest_count_and_stops_when_told():
    probe, calls = counted(lambda n: n >= 6)
    assert first_true(0, 16, probe) == (5, 6, False)
    assert calls == [8, 4, 6, 5]
    # the lower end not probed: the middle rounds up (as an inclusive search over [1, 16])
    probe, calls = counted(lambda n: n >= 6)
    assert first_true(0, 16, probe, upper=True)[1] == 6 and calls[0] == 8
    assert first_true(0, 16, lambda n: None) == (0, 16, True)


def test_doubling_gallops_to_a_count_with_the_property():
    probe, calls = counted(lambda n: n >= 5)
    assert doubling(12, probe) == (4, 8, False) and calls == [1, 2, 4, 8]
    probe, calls = counted(lambda n: False)
    assert doubling(5, probe) == (5, None, False) and calls == [1, 2, 4, 5]  # the limit is probed last
    assert doubling(5, lambda n: None if n > 2 else False) == (2, None, True)


def test_last_true_finds_the_largest_count():
    probe, calls = counted(lambda n: n <= 9)
    assert last_true(0, 16, probe) == (9, 10, False)
    assert calls == [8, 12, 10, 9]


def test_shortest_window_and_ddmin_find_a_pair_far_apart():
    culprits = {3, 11}
    fails = lambda units: culprits <= set(units)  # noqa: E731 - a predicate
    order = list(range(16))
    window = shortest_window(order, fails)
    assert window == list(range(3, 12))
    assert ddmin(window, fails) == [3, 11]


def test_budget_counts_probes_and_seconds_and_its_phases():
    budget = Budget(probes=2, seconds=60)
    budget.spend()
    budget.spend()
    with pytest.raises(Stopped, match="the bound of 2 sessions was reached"):
        budget.spend()
    phase = budget.phase(3)
    assert phase.probes == 5 and not phase.out_of_probes()
    phase.count()
    assert phase.used == 3 and budget.used == 3  # a phase counts into its parent
    late = Budget(seconds=0.01, started=time.monotonic() - 1)
    assert late.out_of_time() and not late.out_of_probes()
    with pytest.raises(Stopped, match="the deadline of 0.01 s passed"):
        late.spend()
    assert Budget().to_record() == {"probes": None, "seconds": None} and not Budget().exhausted()
