"""ORT workers: long-lived child processes that serve typed requests (see protocol.py and
requests.py) and keep their sessions, so a crash or a hang in native code ends a worker, never
ortprep.

    python -m ortprep.runtime.worker      (started by WorkerPool; reads frames on stdin)

In ortprep's process:

- :func:`call` sends one request. Inside :func:`workers_scope` (a pipeline's whole run) it goes to
  the scope's pool, whose worker per interpreter and sessions outlive the call; outside any scope a
  one-shot worker is started, used and closed.
- A request that outlives its ``timeout`` kills its worker and answers "timeout"; a worker that
  dies (a signal, an abort) answers "crashed" with how and the end of its stderr. The next request
  starts a fresh worker.
- :meth:`WorkerPool.run_many` runs requests on N workers of one interpreter at once, each crash
  answering only its own request.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ortprep.runtime.protocol import Reply, Request, WorkerState, module_roots, read_frame, widen_pipe, write_frame

DEFAULT_TIMEOUT = 300.0
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# Lines Python's fatal-error handler adds after a crash; they say nothing about the cause.
_PYTHON_NOISE = (
    "Fatal Python error",
    "Extension modules",
    "Current thread",
    "Thread 0x",
    "  File ",
    "Python runtime state",
)
_HEADER_SIZE = 8


def how_it_died(returncode: int | None) -> str:
    if returncode is None:
        return "timeout"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _test_delay(request: Request) -> float:
    """Test hook: ORTPREP_TEST_WORKER_DELAY=TYPE:SECONDS (or SECONDS for every request) makes the
    worker wait that long before a request of that type, so a test's signal surely lands while the
    work is under way."""
    wanted = os.environ.get("ORTPREP_TEST_WORKER_DELAY", "")
    kind, _, seconds = wanted.rpartition(":")
    if not seconds or (kind and kind != type(request).__name__):
        return 0.0
    return float(seconds)


class Interrupted(RuntimeError):
    """A request to a pool that was interrupted (Ctrl-C, SIGTERM): no worker starts any more."""


class Worker:
    """One worker process of one interpreter (``python``; None: this one)."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python
        handle, self.log_path = tempfile.mkstemp(prefix="ortprep-worker-", suffix=".stderr.txt")
        env = {**os.environ, "PYTHONFAULTHANDLER": "0"}
        # ortprep itself must import under any interpreter (another environment's Python has no ortprep)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        started = time.perf_counter()
        try:
            self.process = subprocess.Popen([python or sys.executable, "-m", "ortprep.runtime.worker"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, env=env)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)  # no worker, no log
            raise
        finally:
            os.close(handle)
        self.start_seconds = time.perf_counter() - started
        widen_pipe(self.process.stdin.fileno())
        widen_pipe(self.process.stdout.fileno())
        self.requests = 0
        self.affinity = None  # which requests it serves: WorkerPool keeps workers apart by it
        _LIVE.add(self)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def call(
        self, request: Request, *, timeout: float = DEFAULT_TIMEOUT, poll: Callable[[], None] | None = None
    ) -> Reply:
        """Send ``request``, wait at most ``timeout`` seconds for its reply. Any exception while
        waiting (Ctrl-C) kills the worker before it propagates: no orphan."""
        log_offset = os.path.getsize(self.log_path)
        self.requests += 1
        try:
            envelope = {
                "roots": module_roots(request),
                "request": pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL),
                "delay": _test_delay(request),
            }
            try:
                write_frame(self.process.stdin.fileno(), envelope)
            except (BrokenPipeError, OSError):
                return self._died(request, log_offset)
            reply = self._receive(time.monotonic() + timeout, poll)
        except TimeoutError:
            self.kill()
            return request.failure("timeout", f"no answer within {timeout:g} s", died="timeout")
        except EOFError:
            return self._died(request, log_offset)
        except BaseException:
            self.kill()
            raise
        return reply

    def _receive(self, deadline: float, poll: Callable[[], None] | None):
        fd = self.process.stdout.fileno()
        buffer = bytearray(_HEADER_SIZE)  # the header, then the payload
        view = memoryview(buffer)
        position, header = 0, True
        while True:
            if position == len(buffer):
                if not header:
                    return pickle.loads(buffer)
                buffer = bytearray(int.from_bytes(buffer, "little"))
                view = memoryview(buffer)
                position, header = 0, False
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(0.1, remaining))
            if poll is not None:
                poll()
            if ready:
                got = os.readv(fd, [view[position:]])
                if not got:
                    raise EOFError
                position += got

    def _died(self, request: Request, log_offset: int) -> Reply:
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        how = how_it_died(self.process.returncode)
        tail = self.stderr_since(log_offset)
        self.close()
        return request.failure("crashed", f"the worker process died ({how}){': ' + tail if tail else ''}",
                               died=how, stderr_tail=tail)

    def stderr_since(self, offset: int, lines: int = 6) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                log.seek(offset)
                text = log.read()
        except OSError:
            return ""
        kept = [line for line in text.strip().splitlines() if line.strip() and not line.startswith(_PYTHON_NOISE)]
        return " ".join(kept[-lines:])

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.wait(timeout=10)
        self.close()

    def close(self) -> None:
        """Ask the worker to end (end of its input), kill it if it does not, remove its log."""
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(Exception):
                stream.close()
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[Worker] = weakref.WeakSet()


@atexit.register
def kill_all() -> None:
    """Kill every worker this process started: at exit, and when an interrupt reaches the main
    thread while another thread waits on a worker (its wait then ends at once)."""
    for worker in list(_LIVE):
        with contextlib.suppress(Exception):
            worker.kill()


class WorkerPool:
    """Workers by interpreter, reused across calls; each keeps its sessions. A crashed or timed-out
    worker is dropped and the next call starts a fresh one."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[Worker]] = {}  # (interpreter, affinity) -> idle workers
        self._busy: set[Worker] = set()
        self._lock = threading.Lock()
        self.interrupted = False  # set by interrupt(): no new worker starts
        self.started = 0  # workers started, over the pool's life
        self.start_seconds: list[float] = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prestart(self, python: str | None = None) -> None:
        """Start a worker now, so that its start-up (Python, onnxruntime's import) overlaps the
        caller's own work before its first request."""
        with self._lock:
            if self._idle.get((python, None)) or any(w.python == python for w in self._busy):
                return
            self.started += 1
        worker = Worker(python)
        with self._lock:
            self.start_seconds.append(worker.start_seconds)
            self._idle.setdefault((python, None), []).append(worker)

    def interrupt(self) -> None:
        """Ctrl-C or SIGTERM while other threads wait on this pool's workers: kill every worker (the
        waits end at once, as "crashed") and start no new one (a request then raises Interrupted)."""
        with self._lock:
            self.interrupted = True
            workers = [w for ws in self._idle.values() for w in ws] + list(self._busy)
            self._idle.clear()
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.kill()

    def _acquire(self, python: str | None, affinity=None) -> Worker:
        with self._lock:
            if self.interrupted:
                raise Interrupted("the run was interrupted")
            idle = self._idle.setdefault((python, affinity), [])
            while idle:
                worker = idle.pop()
                if worker.alive:
                    self._busy.add(worker)
                    return worker
            self.started += 1
        worker = Worker(python)
        worker.affinity = affinity
        with self._lock:
            self.start_seconds.append(worker.start_seconds)
            self._busy.add(worker)
        return worker

    def _release(self, worker: Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            if worker.alive:
                self._idle.setdefault((worker.python, worker.affinity), []).append(worker)

    def call(self, request: Request, *, python: str | None = None, timeout: float = DEFAULT_TIMEOUT,
             poll: Callable[[], None] | None = None) -> Reply:
        """Send ``request`` to a worker of ``python`` (None: this interpreter)."""
        worker = self._acquire(str(python) if python else None, request.affinity())
        try:
            return worker.call(request, timeout=timeout, poll=poll)
        finally:
            self._release(worker)

    def run_many(self, requests: Sequence[Request], jobs: int, on_done: Callable[[int, Reply], None] | None = None, *,
                 python: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> list[Reply]:
        """Run ``requests`` on up to ``jobs`` workers at once; replies in the requests' order.
        ``on_done(index, reply)`` is called as each finishes (from the thread that waited on it)."""
        from concurrent.futures import ThreadPoolExecutor

        replies: list[Reply | None] = [None] * len(requests)

        def one(index: int) -> None:
            replies[index] = self.call(requests[index], python=python, timeout=timeout)
            if on_done is not None:
                on_done(index, replies[index])

        executor = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            for future in [
                executor.submit(contextvars.copy_context().run, one, index) for index in range(len(requests))
            ]:
                future.result()
        except BaseException:
            # Ctrl-C (or a failure): what has not started never will, what runs ends now.
            executor.shutdown(wait=False, cancel_futures=True)
            self.interrupt()
            raise
        executor.shutdown(wait=True)
        return replies  # type: ignore[return-value]

    def sessions_created(self, python: str | None = None) -> Counter:
        """Sessions built per model file (absolute path) by this pool's workers of ``python``."""
        from ortprep.runtime.requests import Stats

        total = Counter()
        with self._lock:
            wanted = str(python) if python else None
            workers = [w for (owner, _affinity), idle in self._idle.items() if owner == wanted for w in idle]
        for worker in workers:
            reply = worker.call(Stats(), timeout=30)
            if reply.ok:
                total.update(reply.sessions_created)
        return total

    def close(self) -> None:
        with self._lock:
            workers = [w for ws in self._idle.values() for w in ws] + list(self._busy)
            self._idle.clear()
            self._busy.clear()
        for worker in workers:
            worker.close()


_POOL: contextvars.ContextVar[WorkerPool | None] = contextvars.ContextVar("ortprep_worker_pool", default=None)


@contextlib.contextmanager
def workers_scope(pool: WorkerPool | None = None, *, prestart: bool = True) -> Iterator[WorkerPool]:
    """Every ORT call inside the block reuses one pool's workers and their sessions; the workers end
    with the block. Nested scopes share the outer one's pool. With ``pool``, the block uses that
    pool and leaves it open (its owner closes it): a worker serving one pipeline after another
    keeps its own workers across them. ``prestart``: start a worker at once (for a run that will
    need ONNX Runtime; a run that may not starts one at its first request)."""
    current = _POOL.get()
    if current is not None:
        yield current
        return
    owned = pool is None
    pool = pool or WorkerPool()
    token = _POOL.set(pool)
    try:
        if owned and prestart:
            pool.prestart()
        yield pool
    finally:
        _POOL.reset(token)
        if owned:
            pool.close()


def current_pool() -> WorkerPool | None:
    return _POOL.get()


def call(request: Request, *, python: str | None = None, timeout: float = DEFAULT_TIMEOUT,
         poll: Callable[[], None] | None = None) -> Reply:
    """Send ``request`` to a worker: the current scope's, or a one-shot one outside any scope."""
    pool = _POOL.get()
    if pool is not None:
        return pool.call(request, python=python, timeout=timeout, poll=poll)
    with WorkerPool() as one_shot:
        return one_shot.call(request, python=python, timeout=timeout, poll=poll)


# --- in the worker ------------------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    # Reparented (ortprep was killed outright): nobody will read the answer.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _import_ort() -> None:
    # While the worker waits for its first request.
    with contextlib.suppress(Exception):
        import onnxruntime  # noqa: F401


def serve() -> int:
    """The worker's loop: read a request, handle it, write its reply, until the input ends."""
    # The protocol moves to private descriptors; fd 1 becomes stderr, because native libraries print to stdout.
    channel_out = os.dup(1)
    channel_in = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a worker ends
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    importing = threading.Thread(target=_import_ort, daemon=True)
    importing.start()
    state = WorkerState()
    while True:
        try:
            envelope = read_frame(channel_in)
        except EOFError:
            # Pools of pair runs (run -j): their workers and logs go too. By duck type: this loop runs in
            # __main__, and the pool was made by the ortprep.runtime.worker module, another copy of it.
            for kept in state.extras.values():
                if callable(getattr(kept, "close", None)):
                    with contextlib.suppress(Exception):
                        kept.close()
            os._exit(0)  # at once: the background import may still be running
        # Two threads importing numpy at once can see it half-initialized: requests wait for the import.
        importing.join()
        if envelope.get("delay"):
            time.sleep(envelope["delay"])
        for root in envelope.get("roots", []):
            if root not in sys.path:
                sys.path.append(root)
        try:
            request = pickle.loads(envelope["request"])
        except Exception as exc:  # noqa: BLE001 - a request this interpreter cannot read
            write_frame(channel_out, Reply(status="failed", message=f"the worker could not read the request: "
                                                                    f"{type(exc).__name__}: {exc}"))
            continue
        try:
            reply = request.handle(state)
        except Exception as exc:  # noqa: BLE001 - a handler's own failure is the request's answer
            reply = request.failure("failed", f"{type(exc).__name__}: {exc}")
        try:
            write_frame(channel_out, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            write_frame(channel_out, request.failure("failed", f"the reply could not be sent: {exc}"))


if __name__ == "__main__":
    sys.exit(serve())
