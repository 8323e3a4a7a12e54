"""How many samples a slow EP judges within a time bound, and a step's time on that EP.

A simulated EP (QNN's HTP simulator) can take tens of seconds a sample where the real device takes
milliseconds (docs/decisions/reduce-ep-time.md). The first sample is run alone and timed (the
session is kept for the rest); the samples that fit in the bound follow, at least LEAST_SAMPLES,
and the report says how many of how many were judged, and why.

:class:`EpClock` accounts the EP time of a step's judgements (``--ep-total-seconds``). It is not a
search budget: searches count their probes and seconds with ``ortprep.prove.reduction.Budget``, and
quantize's search also stops where the EP's clock is spent.

A step's own bound (``--step-seconds``, :class:`StepTimes` ``deadline``) bounds every clock: no
judgement starts on the EP, and no search trial, once what is left of it would not hold the work
that must follow (the report; --auto's FP16 probe: ``hold``), so that the step ends with its
verdict instead of running past its bound (docs/decisions/speed-ep-verdict.md).
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

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
    # the bound that refused the last judgement: "--ep-total-seconds", or "--step-seconds" (the step's own)
    stopped_by: str | None = None

    def own_left(self) -> float | None:
        return None if self.total is None else max(0.0, self.total - self.spent)

    def left(self) -> float | None:
        """What is left of this clock and of the running step's own bound (step_left), the smaller."""
        own, step = self.own_left(), step_left()
        if step is None:
            return own
        return step if own is None else min(own, step)

    @property
    def exhausted(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0

    def starts(self) -> bool:
        """Whether a judgement may start: this clock is not spent, and the step's bound leaves room
        for the least samples of one (StepTimes.sample_seconds); else counted as refused, with the bound
        that refused it."""
        own = self.own_left()
        if own is not None and own <= 0.0:
            self.refused, self.stopped_by = self.refused + 1, "--ep-total-seconds"
            return False
        times = step_times()
        step = step_left()
        if step is not None and step <= LEAST_SAMPLES * (times.sample_seconds if times is not None else 0.0):
            self.refused, self.stopped_by = self.refused + 1, "--step-seconds"
            return False
        return True

    def spent_words(self, where: str) -> str:
        """'the step's time on qnn (900 s, --ep-total-seconds)' (``where``: "on qnn") or 'the step's
        own time (840 s, --step-seconds)': the bound that stopped the EP's judgements, as a message
        names it."""
        times = step_times()
        own = self.own_left()
        by_step = self.stopped_by == "--step-seconds" if self.stopped_by else own is None or own > 0.0
        if by_step and times is not None and times.bound is not None:
            return f"the step's own time ({times.bound:g} s, --step-seconds)"
        return f"the step's time {where} ({self.total:g} s, --ep-total-seconds)"

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
                "option": option, "stopped_by": self.stopped_by}


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


# The target EP's outputs a step keeps for its later judgements, at most this many bytes
# (docs/decisions/speed-ep-verdict.md): a QDQ candidate judged again (a confirmation, --auto's
# attempts, a search trial whose file came out the same) is not run again on a slow EP.
EP_CACHE_BYTES = 256 * 2**20

# The step's own bound (--step-seconds): no EP judgement and no search trial starts once less than
# STEP_RESERVE seconds of it are left (the report, the findings, a sample run past the estimate)
STEP_RESERVE = 45.0


@dataclass
class StepTimes:
    """Where one quantize step's time goes (the report's ``timing``), and the target EP's outputs it
    already has, by (model file content, EP options, sample content): one step runs each (file,
    sample) on a slow EP at most once, whichever attempt or trial asks. ``progress``: the step's
    progress callback (stage, done, total), for the EP's runs."""

    progress: Callable[[str, int, int], None] | None = None
    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=lambda: {"quantizer": 0.0, "cpu": 0.0, "ep": 0.0,
                                                               "fp16_probe": 0.0})
    ep_runs: int = 0  # samples run on the target EP
    ep_calls: int = 0  # requests to the EP's worker (a session each, unless one was kept)
    ep_cached: int = 0  # samples answered from what an earlier judgement ran
    ep_skipped: int = 0  # samples not run: the first ones decided the EP's verdict (early)
    early: dict[str, int] = field(default_factory=lambda: {"pass": 0, "miss": 0})
    outputs: dict[tuple, dict] = field(default_factory=dict)
    models: dict[tuple, dict] = field(default_factory=dict)  # model key -> placement, seconds a sample
    held_bytes: int = 0
    bound: float | None = None  # the step's own bound in seconds (--step-seconds; None: none)
    hold: float = 0.0  # seconds of the bound kept back for later work (--auto's FP16 probe)
    sample_seconds: float = 0.0  # the longest one sample took on the EP (what a judgement's least samples cost)
    trial_seconds: float = 0.0  # the longest one trial took (its quantizer and CPU EP runs): what the next costs
    stopped: list[str] = field(default_factory=list)  # what the step's bound left undone, in words
    ep_worst: dict[str, float] = field(default_factory=dict)  # sample -> lowest cosine any file had on the EP
    float_runs: dict[tuple, Any] = field(default_factory=dict)  # (file, samples, outputs) -> the float model's run
    float_bytes: int = 0

    exclusive: float = 0.0  # the seconds of the outermost timed blocks (what ``other`` is not)
    _depth: int = 0

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            elapsed = time.monotonic() - started
            self.seconds[what] = self.seconds.get(what, 0.0) + elapsed
            if self._depth == 0:
                self.exclusive += elapsed

    def left(self) -> float | None:
        """Seconds of the step's bound left for new work: its STEP_RESERVE and ``hold`` kept back
        (a hold with the CPU side of a trial added: FP16's probe converts and runs its file too)."""
        if self.bound is None:
            return None
        hold = self.hold + self.trial_seconds if self.hold else 0.0
        return max(0.0, self.bound - (time.monotonic() - self.started) - STEP_RESERVE - hold)

    def keep(self, key: tuple, sample: dict) -> None:
        size = sum(getattr(v, "nbytes", 0) for v in sample.values())
        if key not in self.outputs and self.held_bytes + size <= EP_CACHE_BYTES:
            self.outputs[key] = sample
            self.held_bytes += size

    def record(self) -> dict[str, Any]:
        """The report's ``timing``: seconds by kind (the EP's include its sessions; the FP16 probe's
        include its own CPU and EP runs, counted there too), the EP's sample runs, and the rest
        (preparation, the data, findings, latency) as ``other``."""
        total = time.monotonic() - self.started
        seconds = {k: round(v, 2) for k, v in self.seconds.items()}
        return {"total_s": round(total, 2), "quantizer_s": seconds.get("quantizer", 0.0),
                "cpu_eval_s": seconds.get("cpu", 0.0), "ep_s": seconds.get("ep", 0.0),
                "fp16_probe_s": seconds.get("fp16_probe", 0.0),
                "other_s": round(max(0.0, total - self.exclusive), 2),
                "ep_runs": self.ep_runs, "ep_requests": self.ep_calls, "ep_cached": self.ep_cached,
                "ep_skipped_early": self.ep_skipped, "ep_early": dict(self.early),
                "step_seconds": self.bound, "step_stopped": list(self.stopped)}


_CURRENT: ContextVar[StepTimes | None] = ContextVar("ortprep_step_times", default=None)


def step_times() -> StepTimes | None:
    """The running step's ledger (None outside one)."""
    return _CURRENT.get()


def step_left() -> float | None:
    """Seconds the running step's own bound leaves for new work (StepTimes.left); None outside a
    step or where it has none."""
    times = _CURRENT.get()
    return None if times is None else times.left()


def step_spent(what: str, trial: bool = False) -> bool:
    """Whether the running step's own bound is spent for new work (``trial``: it would not hold one
    more trial as long as the longest so far, StepTimes.trial_seconds); if so, ``what`` (in words)
    is recorded as left undone (the report's ``timing.step_stopped``)."""
    times = _CURRENT.get()
    left = step_left()
    if left is None or left > (times.trial_seconds if trial else 0.0):
        return False
    if what not in times.stopped:
        times.stopped.append(what)
    return True


def hold_step(seconds: float) -> None:
    """Keep ``seconds`` of the running step's own bound back from the work that starts from now
    (StepTimes.hold: --auto's attempts leave FP16's probe its time); 0 gives them back."""
    times = _CURRENT.get()
    if times is not None:
        times.hold = max(0.0, seconds)


@contextmanager
def without_hold() -> Iterator[None]:
    """The block may use the time held back for later work (hold_step): the confirmation of a
    candidate that passed its held-back samples on the EP, which FP16's probe is only there to
    replace where it fails."""
    times = _CURRENT.get()
    held = times.hold if times is not None else 0.0
    hold_step(0.0)
    try:
        yield
    finally:
        hold_step(held)


@contextmanager
def timing_step(progress: Callable[[str, int, int], None] | None = None,
                seconds: float | None = None) -> Iterator[StepTimes]:
    """A step's ledger for the time inside; an enclosing one is reused (--auto's attempts, FP16's
    probe share their step's). ``seconds``: the step's own bound (--step-seconds)."""
    current = _CURRENT.get()
    if current is not None:
        yield current
        return
    times = StepTimes(progress, bound=seconds)
    token = _CURRENT.set(times)
    try:
        yield times
    finally:
        _CURRENT.reset(token)


@contextmanager
def timed(what: str) -> Iterator[None]:
    """Time the block as ``what`` in the running step's ledger (nothing outside a step). A block
    inside another of another kind (an EP run inside the FP16 probe) counts in both."""
    times = _CURRENT.get()
    if times is None:
        yield
        return
    with times.timed(what):
        yield


def model_key(model: Path, provider: str, provider_options: dict[str, str]) -> tuple | None:
    """What an EP's outputs of ``model`` depend on: the file's content, its external data files'
    sizes and times, the EP and its options (StepTimes' cache). None where it cannot be read."""
    import onnx

    try:
        digest = hashlib.sha256(Path(model).read_bytes())
        proto = onnx.load(str(model), load_external_data=False)
        for location in sorted({entry.value for tensor in proto.graph.initializer
                                for entry in tensor.external_data if entry.key == "location"}):
            stat = (Path(model).parent / location).stat()
            digest.update(f"{location}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    except Exception:  # noqa: BLE001 - not a model we can read: not cached
        return None
    return digest.hexdigest(), provider, tuple(sorted(provider_options.items()))


def float_run(model: Path, feeds: list[dict[str, Any]], outputs: list[str] | None, run: Callable[[], Any]) -> Any:
    """``run()`` (a float model's RunOutcome on ``feeds``), or within a step the one an earlier call
    with the same file content, samples and outputs got (at most EP_CACHE_BYTES of outputs kept):
    the float model's outputs do not change between --auto's attempts, nor between its sources'
    identical files."""
    times = _CURRENT.get()
    model_part = model_key(model, "cpu", {}) if times is not None else None
    if model_part is None:
        return run()
    key = (model_part, tuple(feed_key(feed) for feed in feeds), tuple(outputs or ()))
    if key in times.float_runs:
        return times.float_runs[key]
    outcome = run()
    size = sum(getattr(v, "nbytes", 0) for sample in (outcome.samples if outcome.ok else []) for v in sample.values())
    if outcome.ok and times.float_bytes + size <= EP_CACHE_BYTES:
        times.float_runs[key] = outcome
        times.float_bytes += size
    return outcome


def feed_key(feed: dict[str, Any]) -> str:
    """One sample's content: its inputs' names, types, shapes and bytes."""
    import numpy as np

    digest = hashlib.sha256()
    for name in sorted(feed):
        value = np.ascontiguousarray(feed[name])
        digest.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()
