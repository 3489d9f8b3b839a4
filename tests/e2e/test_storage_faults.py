"""Storage faults with real processes: a disk that fills, and a power cut that tears
SQLite's writes while it checkpoints.

A full disk is a real one where this machine lets the test mount a small tmpfs (root),
and the ``sqlite.commit`` failpoint (SQLite's own "database or disk is full", raised
where a full disk raises it) everywhere. Either way the node refuses new work with a 503
that names the problem, a Worker's result is acked ``ok: false``, nothing it did not
commit is acknowledged, and it serves again by itself once the disk has room.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import struct
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.testing import wait_until
from tests.support.rig import Rig


@dataclass
class Disk:
    """The node's data directory, and a way to fill it and to free it again."""

    form: str
    data_dir: Path
    failpoints: str = ""
    switch: Path | None = None
    filler: Path | None = None
    mounted: bool = False
    freed: list[int] = field(default_factory=list)

    def fill(self) -> None:
        if self.switch is not None:
            self.switch.write_text("")
            return
        assert self.filler is not None
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for chunk in (1 << 16, 1 << 12, 1 << 9):
                try:
                    while True:
                        os.write(fd, b"\0" * chunk)
                except OSError as e:
                    assert e.errno == 28, e  # ENOSPC: the disk is full
        finally:
            os.close(fd)

    def free(self) -> None:
        if self.switch is not None:
            self.switch.unlink()
        elif self.filler is not None:
            self.filler.unlink()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture(params=["tmpfs", "failpoint"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    """Requested before ``rig``, so the rig's processes are gone before it is unmounted."""
    data = tmp_path / "data"  # the rig's node keeps its data here
    if request.param == "failpoint":
        data.mkdir()
        yield Disk(
            "failpoint",
            data,
            failpoints="sqlite.commit=error",
            switch=tmp_path / "failpoints" / "sqlite.commit.fail",
        )
        return
    if os.geteuid() != 0 or not _mount_tmpfs(data, "4m"):
        pytest.skip("cannot mount a tmpfs here (needs root): the failpoint form runs")
    try:
        yield Disk("tmpfs", data, filler=data / "filler", mounted=True)
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


def _post(address: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        address + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_full_disk_refuses_new_work_acknowledges_nothing_and_recovers_by_itself(
    disk: Disk, rig: Rig
) -> None:
    rig.start_server(disk.failpoints)
    worker = rig.start_worker()
    sid = rig.session()
    assert rig.wait_turn(sid, rig.client.send_message(sid, "before")["turn"])["status"] == (
        "completed"
    )
    running = rig.call(sid, ("lookup", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)

    disk.fill()
    # a client's new work: a 503 whose JSON names the problem, through plain HTTP ...
    status, body = _post(rig.server.address, "/v1/sessions", {"agent": "assistant"})
    assert status == 503, body
    assert body["error"]["code"] == "storage_error"
    assert "the disk is full" in body["error"]["message"]
    # ... and dex.StorageError from the SDK; a keyed send is tried again until its timeout
    with dex.SyncClient(rig.server.address, timeout=1.5) as short:
        with pytest.raises(dex.StorageError, match="the disk is full"):
            short.create_session("assistant", session_id="during")
        with pytest.raises(dex.StorageError, match="the disk is full"):
            short.send_message(sid, "while full", message_id="m-full")
    # the Worker's result cannot be committed: acked ok: false, and the Worker says so
    rig.open_gate("g")
    wait_until(
        lambda: "result refused" in worker.output() and "the disk is full" in worker.output(),
        20,
        what="the Worker heard its result refused",
    )
    # reads go on: the turn is still running, nothing of the refused result shows
    snapshot = rig.client.get_agent_snapshot(sid)
    assert snapshot["current_turn"]["number"] == running
    assert snapshot["current_turn"]["tool_calls"][0]["status"] != "succeeded"

    disk.free()
    # no restart: new work commits again, and the running turn finishes (its attempt
    # failed: its result was never committed; the read tool runs again)
    wait_until(
        lambda: _post(rig.server.address, "/v1/sessions", {"agent": "assistant"})[0] == 201,
        20,
        what="the node accepts writes again",
    )
    turn = rig.wait_turn(sid, running)
    assert turn["status"] == "completed"
    lookup = next(s for s in turn["steps"] if s["type"] == "CallTool")
    assert [a["outcome"] for a in lookup["attempts"]] == ["failed", "succeeded"]
    log = rig.server.output()
    assert log.count("commit failed: the disk is full") == 1, log[-3000:]
    assert "commits succeed again" in log

    # what was refused was never written: not after a restart either
    rig.restart_server()
    with pytest.raises(dex.NotFound):
        rig.client.get_agent_snapshot("during")
    texts = [i.get("text") for i in rig.client.get_agent_snapshot(sid)["history"]]
    assert "while full" not in texts and "before" in texts


# --- a power cut during a checkpoint --------------------------------------------------------

WAL_HEADER = 32
FRAME_HEADER = 24


def wal_pages(wal: Path) -> tuple[int, list[int]]:
    """The page size and the pages of the current WAL's valid frames (the ones whose salts
    match the header: a checkpoint copies exactly these into the database file)."""
    data = wal.read_bytes()
    page_size, _, salt1, salt2 = struct.unpack(">IIII", data[8:24])
    pages = []
    offset = WAL_HEADER
    while offset + FRAME_HEADER + page_size <= len(data):
        page, _, s1, s2 = struct.unpack(">IIII", data[offset : offset + 16])
        if (s1, s2) != (salt1, salt2):
            break
        pages.append(page)
        offset += FRAME_HEADER + page_size
    return page_size, pages


def tear(db: Path, rng: random.Random) -> int:
    """Leave the files as a power cut in the middle of a checkpoint can: every database
    page the checkpoint was copying from the WAL half written (garbage from a random
    offset in the page), the WAL's tail a half-written frame of a commit that was never
    acknowledged, and the shared-memory index garbage. What was fsynced before an
    acknowledgement (the WAL's frames) stays as it was. Returns the pages torn."""
    wal = db.with_name(db.name + "-wal")
    page_size, pages = wal_pages(wal)
    with db.open("r+b") as f:
        for page in set(pages):
            cut = rng.randrange(1, page_size)
            f.seek((page - 1) * page_size + cut)
            f.write(rng.randbytes(page_size - cut))
    with wal.open("ab") as f:
        f.write(rng.randbytes(FRAME_HEADER + page_size // 2))
    shm = db.with_name(db.name + "-shm")
    if shm.exists():
        shm.write_bytes(rng.randbytes(shm.stat().st_size))
    return len(set(pages))


def test_a_power_cut_that_tears_a_checkpoint_loses_no_acknowledged_write(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sessions = [rig.session() for _ in range(4)]
    acked: dict[str, list[str]] = {sid: [] for sid in sessions}
    for n in range(6):
        for sid in sessions:
            text = f"{sid} message {n}"
            turn = rig.client.send_message(sid, text, message_id=f"{sid}-{n}")["turn"]
            acked[sid].append(text)
            if n % 2 == 0:
                rig.wait_turn(sid, turn)
    rig.server.kill()  # the power goes: nothing after the last acknowledgement is trusted
    db = rig.server.data_dir / "dex.sqlite3"
    assert tear(db, random.Random(14)) > 0, "the WAL holds pages a checkpoint would copy"

    rig.server.start()
    for sid in sessions:
        rig.wait_turn(sid, len(acked[sid]))
        history = rig.client.get_agent_snapshot(sid)["history"]
        texts = [item["text"] for item in history if item["type"] == "user"]
        assert texts == acked[sid], sid
    rig.server.kill()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# --- a corrupt row ------------------------------------------------------------------------------


def _get(address: str, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(address + path, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_corrupt_session_fails_alone_and_does_not_stop_the_node_from_starting(
    rig: Rig,
) -> None:
    rig.start_server()
    rig.start_worker()
    broken, fine = rig.session(), rig.session()
    rig.call(broken, ("lookup", {"key": "k", "gate": "held"}))
    rig.wait_entered("held", 1)  # the session to break is mid-turn: start recovers it
    rig.server.kill()
    db = rig.server.data_dir / "dex.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute(
            'UPDATE sessions SET state = \'{"format": 1, "id": [\' WHERE id = ?', (broken,)
        )
    rig.server.start()  # it starts: recovery leaves the corrupt session out

    status, body = _get(rig.server.address, f"/v1/sessions/{broken}")
    assert status == 500, body
    assert body["error"]["code"] == "corrupt_record"
    assert f"the stored state of session {broken!r} cannot be read" in body["error"]["message"]
    assert body["error"]["details"] == {"session_id": broken}
    assert "action=session.corrupt" in rig.server.output() or '"session.corrupt"' in (
        rig.server.output()
    )
    # every other session serves
    assert rig.wait_turn(fine, rig.client.send_message(fine, "still here")["turn"])["text"] == (
        "echo: still here"
    )
    rig.open_gate("held")
