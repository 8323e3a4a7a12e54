"""The reduction engine: bisection and delta debugging over ordered units, driven by a probe.

A probe answers whether a set of units (a count of them, or a set) has the property searched for
(the session fails; the quantized model passes the gate). Every search spends one :class:`Budget`:
at most ``probes`` probes and ``seconds`` of wall time. Polygraphy's ``debug reduce`` is the model:
bisect first, then reduce what is left one piece at a time. Used by :mod:`ortprep.prove.culprits`
(a failing session's culprits) and by quantize's fewest-float search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A probe over a count: True (has the property), False, or None (no further probe may run).
CountProbe = Callable[[int], "bool | None"]
SetProbe = Callable[[Sequence[int]], bool]
Progress = Callable[[int, int], None]


class Stopped(Exception):
    """The budget ended a search: no further probe may run (the message says which bound)."""


@dataclass
class Budget:
    """At most ``probes`` probes (None: no bound) and ``seconds`` of wall time from ``started``
    (None: no bound) for one search. A probe under way when the time passes finishes (each has its
    caller's own timeout). ``phase(n)`` is a sub-budget of ``n`` more probes past this one's count
    that shares its clock and counts into it."""

    probes: int | None = None
    seconds: float | None = None
    started: float = field(default_factory=time.monotonic)
    used: int = 0
    progress: Progress | None = field(default=None, repr=False, compare=False)
    parent: Budget | None = field(default=None, repr=False, compare=False)

    def out_of_probes(self) -> bool:
        return self.probes is not None and self.used >= self.probes

    def out_of_time(self) -> bool:
        return self.seconds is not None and time.monotonic() - self.started > self.seconds

    def exhausted(self) -> bool:
        return self.out_of_probes() or self.out_of_time()

    def why(self) -> str:
        """Which bound ended the search."""
        if self.out_of_probes():
            return f"the bound of {self.probes} sessions was reached"
        return f"the deadline of {self.seconds:g} s passed"

    def spend(self) -> None:
        """Count one probe, or raise :class:`Stopped` where a bound is reached."""
        if self.out_of_probes() or self.out_of_time():
            raise Stopped(self.why())
        self.count()

    def count(self) -> None:
        """Count one probe that ran (its caller checked the bounds)."""
        self.used += 1
        if self.parent is not None:
            self.parent.count()

    def report(self) -> None:
        if self.progress is not None:
            self.progress(self.used, self.probes or self.used)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.used, self.used)  # a bar's total becomes what was spent

    def phase(self, probes: int) -> Budget:
        return Budget(probes=self.used + probes, seconds=self.seconds, started=self.started, used=self.used,
                      parent=self)

    def seconds_left(self) -> float | None:
        """The seconds left of ``seconds`` (None: no bound), at least 0."""
        return None if self.seconds is None else max(0.0, self.seconds - (time.monotonic() - self.started))

    @property
    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def to_record(self) -> dict[str, Any]:
        return {"probes": self.probes, "seconds": self.seconds}


def first_true(low: int, high: int, probe: CountProbe, *, upper: bool = False) -> tuple[int, int, bool]:
    """Bisection for the smallest count with the property, between ``low`` (without it, or below
    the range) and ``high`` (with it; not probed). ``upper``: the middle rounds up (the lower end was
    not probed). Returns (low, high, stopped): ``high`` the smallest known to have it."""
    while high - low > 1:
        middle = (low + high + (1 if upper else 0)) // 2
        verdict = probe(middle)
        if verdict is None:
            return low, high, True
        if verdict:
            high = middle
        else:
            low = middle
    return low, high, False


def doubling(limit: int, probe: CountProbe, start: int = 1) -> tuple[int, int | None, bool]:
    """Galloping search for a count with the property: ``start``, twice that, ... up to ``limit``
    (probed last), until one has it. Returns (the last count without it, 0 if none; the first
    with it, None if none; stopped). A bisection between the two (:func:`first_true`) follows."""
    low, count = 0, start
    while True:
        count = min(count, limit)
        verdict = probe(count)
        if verdict is None:
            return low, None, True
        if verdict:
            return low, count, False
        low = count
        if count == limit:
            return low, None, False
        count *= 2


def last_true(low: int, high: int, probe: CountProbe) -> tuple[int, int, bool]:
    """Bisection for the largest count with the property, between ``low`` (with it; not probed)
    and ``high`` (without it, or past the range). Returns (low, high, stopped)."""
    while high - low > 1:
        middle = (low + high) // 2
        verdict = probe(middle)
        if verdict is None:
            return low, high, True
        if verdict:
            low = middle
        else:
            high = middle
    return low, high, False


def shortest_window(order: list[int], probe: SetProbe, floor: int = 0) -> list[int]:
    """The shortest window of ``order`` (which has the property as a whole) that has it alone: the
    first end whose prefix has it, then the last start whose window to that end still has it.
    Prefixes ending before unit ``floor`` are known not to have it."""
    low = next((k for k, u in enumerate(order) if u >= floor), len(order) - 1)
    _, end, _ = first_true(low - 1, len(order) - 1, lambda k: probe(order[:k + 1]), upper=True)
    start, _, _ = last_true(0, end + 1, lambda k: probe(order[k:end + 1]))
    return order[start:end + 1]


def ddmin(units: list[int], probe: SetProbe) -> list[int]:
    """A 1-minimal subset of ``units`` (which has the property) that has it: Zeller's ddmin over
    chunks in order; the complements are tried once there are more than two chunks."""
    current, chunks_wanted = list(units), 2
    while len(current) >= 2:
        chunks = split(current, chunks_wanted)
        reduced = False
        for chunk in chunks:
            if probe(chunk):
                current, chunks_wanted, reduced = chunk, 2, True
                break
        if not reduced and chunks_wanted > 2:
            for chunk in chunks:
                rest = [u for u in current if u not in chunk]
                if probe(rest):
                    current, chunks_wanted, reduced = rest, max(chunks_wanted - 1, 2), True
                    break
        if not reduced:
            if chunks_wanted >= len(current):
                break
            chunks_wanted = min(len(current), 2 * chunks_wanted)
    return current


def split(items: list[int], parts: int) -> list[list[int]]:
    """``items`` in ``parts`` chunks as even as can be, in order."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        if end > start:
            chunks.append(items[start:end])
        start = end
    return chunks
