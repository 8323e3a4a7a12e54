"""How a request handler says that its work raised: the exception's words on one line, its type,
and the tail of its traceback, as data the parent reads (a failed engine or quantizer call is a
failed candidate, never a crash of ortprep)."""

from __future__ import annotations

import traceback


def record_failure(reply, exc: BaseException, *, message_chars: int | None = None,
                   traceback_chars: int = 2000) -> None:
    """Fill ``reply.message``, ``reply.error_type`` and ``reply.traceback`` from ``exc``; call it
    inside the ``except`` block, where the traceback is the exception's."""
    words = " ".join(str(exc).split())
    reply.message = (words[:message_chars] if message_chars else words) or type(exc).__name__
    reply.error_type = type(exc).__name__
    reply.traceback = traceback.format_exc()[-traceback_chars:]
