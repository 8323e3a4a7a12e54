"""How many samples a slow EP judges within a time bound, and a step's time on that EP.

A simulated EP (QNN's HTP simulator) can take tens of seconds a sample where the real device takes
milliseconds (docs/decisions/reduce-ep-time.md). The first sample is run alone and timed (the
session is kept for the rest); the samples that fit in the bound follow, at least LEAST_SAMPLES,
and the report says how many of how many were judged, and why.

:class:`EpClock` accounts the EP time of a step's judgements (``--ep-total-seconds``). It is not a
search budget: searches count their probes and seconds with ``ortprep.prove.reduction.Budget``, and
quantize's search also stops where the EP's clock is spent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

LEAST_SAMPLES = 2  # an EP judges at least this many samples, bound or not


@dataclass
class EpClock:
    """The time a step's judgements on a slow EP took together, against ``total`` seconds (None:
    no bound): each judgement is also bound by what is left, and none starts once it is spent.
    Accounting of EP time across a step's judgements, not a reduction budget (prove.reduction.Budget)."""

    total: float | None
    spent: float = 0.0
    runs: int = 0  # judgements that ran
    refused: int = 0  # judgements not run: the time was spent

    def left(self) -> float | None:
        return None if self.total is None else max(0.0, self.total - self.spent)

    @property
    def exhausted(self) -> bool:
        return self.total is not None and self.spent >= self.total

    def timed(self, work: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return work()
        finally:
            self.spent += time.monotonic() - started
            self.runs += 1

    def bound(self, seconds: float | None) -> float | None:
        """One judgement's bound: ``seconds`` or what is left, the smaller."""
        left = self.left()
        if left is None:
            return seconds
        return left if seconds is None else min(seconds, left)

    def record(self, option: str) -> dict[str, Any]:
        return {"total": self.total, "spent": round(self.spent, 1), "runs": self.runs, "refused": self.refused,
                "option": option}


def samples_within(seconds_per_sample: float | None, offered: int, seconds: float | None,
                   least: int = LEAST_SAMPLES) -> int:
    """How many of ``offered`` samples a run of ``seconds_per_sample`` each fits in ``seconds``
    (None: no bound), at least ``least`` (or all, where fewer are offered)."""
    if seconds is None or seconds_per_sample is None or seconds_per_sample <= 0 or offered <= least:
        return offered
    return max(least, min(offered, int(seconds // seconds_per_sample)))


def run_within(run: Callable[[list], Any], feeds: list, seconds: float | None, ep: str) -> tuple[Any, dict | None]:
    """``run(part)`` (a reply with ``ok``, ``samples`` and ``run_seconds`` for the part) on the
    samples of ``feeds`` that fit in ``seconds``: the first alone, timed, then the rest that fit
    (the worker keeps the session the first built). Returns the reply, its ``samples`` those of the
    first samples judged, and what the bound left out (None: nothing; a caller judges the matching
    first samples of its own)."""
    if seconds is None or len(feeds) <= LEAST_SAMPLES:
        return run(feeds), None
    first = run(feeds[:1])
    if not first.ok:
        return first, None
    count = samples_within(first.run_seconds, len(feeds), seconds)
    rest = run(feeds[1:count])
    if not rest.ok:
        return rest, None
    first.samples = first.samples + rest.samples
    limited = None if count == len(feeds) else {"samples": count, "offered": len(feeds), "ep": ep,
                                                "seconds_per_run": round(first.run_seconds or 0.0, 2), "bound": seconds}
    return first, limited


def limited_words(limited: dict, option: str = "--ep-seconds") -> str:
    """'3 of 8 samples (a run took 45.2 s on qnn here; --ep-seconds 180)': what a report says."""
    return (f"{limited['samples']} of {limited['offered']} samples (a run took {limited['seconds_per_run']:.1f} s on "
            f"{limited['ep']} here; {option} {limited['bound']:g})")
