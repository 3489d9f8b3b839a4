"""dex.testing.Gates: a tool says it reached a gate, and waits until the test opens it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from dex.testing import Gates


async def test_a_tool_waits_at_its_gate_until_it_opens(tmp_path: Path) -> None:
    gates = Gates(tmp_path)
    waiting = asyncio.create_task(gates.wait("g", 2))
    while not (tmp_path / "g.2.entered").exists():
        await asyncio.sleep(0.005)
    assert not waiting.done()  # held at the gate
    (tmp_path / "g.open").write_text("")
    await asyncio.wait_for(waiting, 5)


async def test_no_gate_passes_at_once(tmp_path: Path) -> None:
    await asyncio.wait_for(Gates(tmp_path).wait(None, 1), 1)
    assert os.listdir(tmp_path) == []
