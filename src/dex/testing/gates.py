"""Gates: a tool under test stops at a named point until the test opens it.

A tool calls ``await gates.wait("g", ctx.attempt)``: it writes ``g.<attempt>.entered``
in the gates folder and waits until ``g.open`` exists. The test waits for the
``entered`` file (the tool runs now: kill something) and writes ``g.open`` to let it
finish. Only files: the tool may run in another process.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path


class Gates:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    async def wait(self, gate: str | None, attempt: int) -> None:
        """Say that attempt ``attempt`` reached ``gate``, then wait until it opens (no
        gate: return at once)."""
        if not gate:
            return
        (self.path / f"{gate}.{attempt}.entered").write_text("")
        while not (self.path / f"{gate}.open").exists():
            await asyncio.sleep(0.005)
