"""SQLite serves one node: a second server on the same data directory is refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

import dex
from dex.testing.harness import ServerProcess
from dex.testing.wait import wait_until


def test_a_second_server_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = ServerProcess(data).start()
    second = ServerProcess(data)  # same directory, another port
    try:
        with dex.SyncClient(first.address) as client:
            assert client.list_agents() == []

        with pytest.raises(RuntimeError, match="in use by another Dex server"):
            second.start()

        assert second.proc is not None and second.proc.wait(10) != 0
        assert f"pid {first.pid}" in second.output()
        assert "postgresql://" in second.output()  # it says how to run several nodes
        with dex.SyncClient(first.address) as client:
            assert client.list_agents() == []  # the first one is untouched

        first.kill()  # the kernel releases the lock with the process
        second.start()
        wait_until(second.ready, 20, what="the second server serves")
    finally:
        first.kill()
        second.kill()
