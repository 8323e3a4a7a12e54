"""The one protocol between ortprep and its ORT workers: typed requests, typed replies, and the
frames that carry them.

A request is a dataclass with a ``handle(state) -> Reply`` method; the worker calls it and sends
back what it returns, so a new kind of work (the pipeline's own requests included) needs no change
here or in the worker. Its reply type says what a crash or a timeout answers. Frames are an 8-byte
length and a pickle: numpy arrays travel as they are. Imports the standard library only (numpy
and onnxruntime are imported by the handlers that need them), so every interpreter can serve it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import struct
import sys
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

_HEADER = struct.Struct("<Q")
# Sessions one worker keeps; more are closed oldest first (each holds its model's weights).
MAX_SESSIONS = 4


@dataclass
class Reply:
    """What a request answers. ``status``: ok; failed (the work raised: ``message`` says why, at
    ``stage``); crashed (the worker died: how, and its stderr's last lines); timeout."""

    status: str = "ok"
    message: str = ""
    stage: str | None = None
    died: str | None = None  # crashed: how (SIGABRT, exit code 1); timeout: "timeout"
    stderr_tail: str = ""  # crashed: the worker's last lines on stderr

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Request:
    """Base of every request. Subclasses are dataclasses that implement :meth:`handle`; it runs in
    the worker, where ``state`` keeps ORT, its sessions and the counters across requests."""

    reply_type: ClassVar[type[Reply]] = Reply

    def handle(self, state: WorkerState) -> Reply:  # pragma: no cover - abstract
        raise NotImplementedError

    def affinity(self):
        """Requests with different affinities never share a worker (None: any worker of the
        interpreter). QNN keeps one HTP backend per process, and the first session's options (its
        soc_model) stick for every later session there: QNN requests with other options need a
        worker of their own."""
        return None

    def failure(self, status: str, message: str, *, died: str | None = None, stderr_tail: str = "") -> Reply:
        """The reply of this request's type for a request that never finished."""
        return self.reply_type(status=status, message=message, died=died, stderr_tail=stderr_tail)


@dataclass
class CachedSession:
    session: Any
    graph_outputs: list[str]  # the model's own outputs (a session may expose intermediates too)
    extra_outputs: frozenset[str] = frozenset()


@dataclass
class WorkerState:
    """What a worker keeps between requests: onnxruntime, its sessions (by model file and
    options), the plugin libraries it registered, and how many sessions it built per model."""

    sessions: OrderedDict = field(default_factory=OrderedDict)
    sessions_created: Counter = field(default_factory=Counter)
    registered: set[str] = field(default_factory=set)
    extras: dict[str, Any] = field(default_factory=dict)  # for requests defined elsewhere
    _ort: Any = None

    @property
    def ort(self):
        if self._ort is None:
            import onnxruntime

            self._ort = onnxruntime
        return self._ort

    def register_plugin(self, provider: str, library: str) -> None:
        if provider not in self.registered:
            self.ort.register_execution_provider_library(provider, library)
            self.registered.add(provider)

    def count_session(self, model: str) -> None:
        self.sessions_created[model if model.startswith("<") else os.path.abspath(model)] += 1  # "<memory>": bytes

    def cached(self, base: tuple, outputs: set[str], exact: bool = False) -> CachedSession | None:
        """A session whose key starts with ``base`` (the model file and options; the last element of
        a key is the extra outputs) and that exposes ``outputs`` (``exact``: those and no more)."""
        self._forget_missing()
        for key, entry in self.sessions.items():
            if key[:-1] == base and (entry.extra_outputs == outputs if exact
                                     else outputs <= entry.extra_outputs | set(entry.graph_outputs)):
                self.sessions.move_to_end(key)
                return entry
        return None

    def keep(self, key: tuple, entry: CachedSession) -> None:
        self.sessions[key] = entry
        self.sessions.move_to_end(key)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    def release(self, model: str) -> None:
        """Close every session of ``model`` (its weights and the EP's memory go with it)."""
        for key in [k for k in self.sessions if k[0] == model]:
            del self.sessions[key]

    def _forget_missing(self) -> None:
        # Sessions of temporary models that are gone, or were written again since (a key holds the
        # file's size and time), cannot be asked for again. quantize's rankings write each group of
        # exposed tensors to one file in turn: the session of every earlier group stayed cached,
        # each with an arena grown to its run (docs/decisions/docs-worker-session-memory.md).
        for key in [k for k in self.sessions if self._stale(k)]:
            del self.sessions[key]

    @staticmethod
    def _stale(key: tuple) -> bool:
        try:
            stat = os.stat(key[0])
        except OSError:
            return True
        return (stat.st_size, stat.st_mtime_ns) != tuple(key[1:3])


def model_key(path: str) -> tuple:
    """A model file as the session cache knows it: path, size, modification time."""
    absolute = os.path.abspath(path)
    stat = os.stat(absolute)
    return absolute, stat.st_size, stat.st_mtime_ns


# A C++ function's signature in an EP's exception ("onnxruntime::openvino_ep::BasicBackend::BasicBackend
# (std::unique_ptr<onnx::ModelProto>&, ...)", "auto ...OvExceptionBoundary(Func&&, ...) [with bool
# typed = false; ...]"): the OpenVINO EP's 'dynamic rank' refusal of Silero v5 was 3 KB of them
# around its one sentence.
# At least three names joined by '::' (a namespace, a class, a function), so that a node named
# "conv::block(1)" or a "std::max(a, b)" in a message stays; possessive, and anchored where a name
# starts, so that a long word costs one pass.
_SIGNATURE = re.compile(r"(?<![\w~:])(?:(?:auto|void|bool|int) )?(?:[\w~]++(?:<[^<>()]*+>)?::){2,}+[\w~]++"
                        r"(?:<[^<>()]*+>)?\((?:[^()]|\([^()]*+\))*+\)(?: const)?(?: \[with [^\]]*+\])?")
# An EP's message is cleaned from at most this many characters (it is cut shorter after).
_CLEAN_CHARS = 16_000


def clean_error(message: str) -> str:
    """ORT's exception text without its error-code prefix, build paths and C++ signatures."""
    text = message.strip()[:_CLEAN_CHARS].removeprefix("[ONNXRuntimeError] : ")
    text = re.sub(r"^\d+ : [A-Z_]+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+:\d+ ", "", text)
    text = re.sub(r"(?<!\S)/\S+\.(?:cc|cpp|cxx|h|hpp):\d+ ", "", text)
    if "::" in text:
        text = _SIGNATURE.sub("", text)
    # OpenVINO's chain of source locations ("Exception from src/inference/src/cpp/core.cpp:114: ...")
    text = re.sub(r"Exception from src/\S+:\d+:\s*", "", text)
    text = re.sub(r" at src/\S+:\d+:", ":", text)
    return " ".join(text.split())


# --- frames -------------------------------------------------------------------------------------


def encode(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def write_frame(fd: int, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, _HEADER.pack(len(payload)))
    view = memoryview(payload)
    while view:
        written = os.write(fd, view[: 1 << 22])
        view = view[written:]


def read_exactly(fd: int, count: int) -> bytearray | None:
    """``count`` bytes from ``fd`` (blocking), or None at end of file. Reads into one buffer: a
    pipe hands out 64 KiB at a time, and os.read(fd, big) allocates ``big`` bytes per call."""
    buffer = bytearray(count)
    view = memoryview(buffer)
    position = 0
    while position < count:
        got = os.readv(fd, [view[position:]])
        if not got:
            return None
        position += got
    return buffer


def widen_pipe(fd: int) -> None:
    """A 1 MiB pipe buffer instead of 64 KiB, where the system allows it (Linux): fewer switches
    between the two processes for big arrays and models."""
    with contextlib.suppress(Exception):
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)


def read_frame(fd: int) -> Any:
    """The next message on ``fd``; EOFError when the other side closed it."""
    header = read_exactly(fd, _HEADER.size)
    if header is None:
        raise EOFError
    payload = read_exactly(fd, _HEADER.unpack(header)[0])
    if payload is None:
        raise EOFError
    return pickle.loads(payload)


def module_roots(request: Request) -> list[str]:
    """Folders to put on the worker's sys.path so that it can unpickle ``request``: the root its
    class's module is imported from (a test module, a caller's package outside ortprep)."""
    roots = []
    for cls in type(request).__mro__:
        module = sys.modules.get(cls.__module__)
        filename = getattr(module, "__file__", None)
        if not filename or cls.__module__ in ("__main__", "builtins"):
            continue
        root = os.path.dirname(os.path.abspath(filename))
        depth = cls.__module__.count(".") + (1 if os.path.basename(filename) == "__init__.py" else 0)
        for _ in range(depth):
            root = os.path.dirname(root)
        if root not in roots:
            roots.append(root)
    return roots
