"""SQLite serves one node: a second server on the same data directory is refused at start.
The node's writer process lives and dies with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import dex
from dex.server.app import STORE_LOST
from dex.testing.harness import ServerProcess
from dex.testing.wait import wait_until
from tests.support.rig import Rig


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


def writer_of(server: ServerProcess) -> int:
    """The pid of the node's SQLite writer process: its one child running writer.py."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == server.pid and b"writer.py" in command:
            found.append(int(entry.name))
    assert len(found) == 1, found
    return found[0]


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # dead, not yet reaped


def test_the_writer_dies_with_its_node_and_a_restart_opens_the_data_at_once(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    writer = writer_of(rig.server)

    rig.server.kill()
    wait_until(lambda: gone(writer), 10, what="the writer dies with its node")
    rig.recover_server()  # the lock is free: no process of the dead node holds the data
    turn = rig.call(sid, ("lookup", {"key": "k"}))
    assert rig.wait_turn(sid, turn)["status"] == "completed"


def test_a_node_whose_writer_dies_exits_and_its_restart_recovers(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    first = rig.call(sid, ("lookup", {"key": "k"}))
    rig.wait_turn(sid, first)

    os.kill(writer_of(rig.server), signal.SIGKILL)
    proc = rig.server.proc
    assert proc is not None and proc.wait(10) == STORE_LOST  # it can no longer write
    assert "the SQLite writer process died" in rig.server.output()

    rig.recover_server()
    second = rig.call(sid, ("lookup", {"key": "k"}))
    assert rig.wait_turn(sid, second)["status"] == "completed"
    assert rig.wait_turn(sid, first)["status"] == "completed"  # what was committed stays


def test_a_sigterm_to_every_process_of_the_node_stops_it_cleanly(rig: Rig) -> None:
    # as a supervisor stops a service (systemd signals every process of its group)
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    rig.wait_turn(sid, rig.call(sid, ("lookup", {"key": "k"})))
    writer = writer_of(rig.server)

    os.kill(writer, signal.SIGTERM)
    assert rig.server.terminate() == 0  # drained, the store closed: not a lost writer
    assert gone(writer)
    assert "writer process died" not in rig.server.output()
