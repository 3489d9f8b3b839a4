"""A tool's own record of its side effects, kept outside Dex.

A test tool appends one line per effect (durably); the test then checks what
really happened rather than what Dex says happened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Ledger:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def record(self, effect: str, **fields: Any) -> None:
        line = json.dumps({"effect": effect, **fields}, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self, effect: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in rows if effect is None or r["effect"] == effect]
