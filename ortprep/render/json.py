"""JSON rendering: one document per command, the only thing on stdout with --json."""

from __future__ import annotations

import json
from typing import Any


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n"
