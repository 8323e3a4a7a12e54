"""The quantize step's child process until it sends a :class:`Quantize` request instead
(ortprep.runtime.requests; see :func:`ortprep.runtime.requests.quantize`):

    python -m ortprep.runtime.quantize_worker REQUEST.json

Runs the same handler as the Quantize request and writes its answer as the status JSON the step
reads ({"ok", "error", "type", "traceback"}).
"""

from __future__ import annotations

import json
import sys

from ortprep.runtime.protocol import WorkerState
from ortprep.runtime.requests import StreamingReader, Quantize  # noqa: F401 - StreamingReader: its old home


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    reply = Quantize.from_request(request).handle(WorkerState())
    sys.stderr.write(reply.stderr)  # the step reads quant_pre_process's complaints from this process's stderr
    status = {"ok": reply.ok}
    if not reply.ok:
        status.update(error=reply.message, type=reply.error_type, traceback=reply.traceback)
    with open(request["status"], "w", encoding="utf-8") as out:
        json.dump(status, out)
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its result goes back through the status file
