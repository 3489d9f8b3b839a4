"""The SQLite writer: a process of its own that owns the node's one connection.

The node starts it as ``python -I -S writer.py DATABASE NODE_PID SOCKET_FD``, with one
end of a socket pair open at ``SOCKET_FD`` and the data directory's lock inherited: this module
imports the standard library only, so it starts in milliseconds and shares no
interpreter lock with the node's event loop (measured: in one process the writer thread
and the loop together held the GIL nearly all the time at 64 sessions, and the writer
waited for it four fifths of its wall time).

Frames, both ways: a 4-byte little-endian length, then a ``marshal`` payload.

- In: ``(fail_commit, ops)``. Each op is ``("w", statements)`` (a write: its
  statements, each ``(sql, rows)``) or ``("r", queries)`` (a read: ``(sql, params)``
  each, run back to back, one consistent view). ``fail_commit``: the node's
  ``sqlite.commit`` failpoint was failing when it sent the frame (a test's full disk).
- Out, one frame for each time the writer ran what had come: ``(results, stats)``.
  ``results`` answers every op of those frames in order, each ``(OK, value)`` or
  ``(CONFLICT | FAILED | NOT_COMMITTED | BUG, driver_message, cause)``; ``stats`` is
  ``(commits, operations, busy_seconds, failed_commit_cause, writing)`` for that run
  (``writing``: it held a write, so its commit says whether commits succeed again).

The writer takes every frame that has come, commits all their ops as one transaction
(group commit: the statements of consecutive writes merged, each text once over every
write's rows), and answers once the commit is durable. A batch that fails runs again
with a savepoint per op, so only the bad ones fail; a commit that fails (a full disk)
fails every write of the batch, and its reads run again alone. It exits when the node
closes its end, and dies with the node (``PR_SET_PDEATHSIG``), so that a restarted node
never meets a commit still being written.
"""

from __future__ import annotations

import contextlib
import ctypes
import marshal
import os
import signal
import socket
import sqlite3
import struct
import sys
import time
from typing import Any

OK, CONFLICT, FAILED, NOT_COMMITTED, BUG = range(5)
"""How an op ended: its value; refused by a constraint; failed alone (SQLite's message and
its cause); not committed, as the whole batch (a full disk); a bug in the writer."""
HEADER = struct.Struct("<I")
CHUNK = 1 << 18
"""Bytes a read takes at most."""


def frame(value: Any) -> bytes:
    """``value`` as a frame: its length, then its ``marshal`` bytes."""
    payload = marshal.dumps(value)
    return HEADER.pack(len(payload)) + payload


def take_frames(buffer: bytearray) -> list[Any]:
    """The values of the whole frames at the start of ``buffer``, removed from it (a
    frame not whole yet stays)."""
    values = []
    while len(buffer) >= HEADER.size:
        (size,) = HEADER.unpack_from(buffer)
        end = HEADER.size + size
        if len(buffer) < end:
            break
        values.append(marshal.loads(buffer[HEADER.size : end]))
        del buffer[:end]
    return values


Op = tuple[str, list[tuple[str, Any]]]
Result = tuple[Any, ...]

_CAUSES = {
    5: "the database is locked by another process",
    8: "the database is read-only",
    10: "a disk I/O error",
    11: "the database file is corrupt",
    13: "the disk is full",
    14: "the database file cannot be opened",
}
"""SQLite's primary result codes, as an operator would name the problem."""


def cause(e: BaseException) -> str:
    """What went wrong, in an operator's words, without table or statement names."""
    code = getattr(e, "sqlite_errorcode", None)
    name = getattr(e, "sqlite_errorname", None) or "a storage error"
    if code is None:
        return str(e)
    return _CAUSES.get(code & 0xFF, f"SQLite error {name}")


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def disk_full() -> sqlite3.OperationalError:
    """The error SQLite raises when the disk fills (SQLITE_FULL): the ``sqlite.commit``
    failpoint raises it where a real full disk does."""
    e = sqlite3.OperationalError("database or disk is full")
    e.sqlite_errorcode = sqlite3.SQLITE_FULL
    e.sqlite_errorname = "SQLITE_FULL"
    return e


class Writer:
    """The connection and the group commit; no I/O of its own but SQLite's."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None

    def run(self, ops: list[Op], fail_commit: bool) -> tuple[list[Result], tuple[Any, ...]]:
        started = time.perf_counter()
        writing = any(kind == "w" for kind, _ in ops)
        try:
            results, failed = self._commit(ops, fail_commit)
        except Exception as e:  # a bug: the writer must still answer, and live on
            self._roll_back()
            bug = (BUG, repr(e), repr(e))
            return [bug] * len(ops), (0, 0, time.perf_counter() - started, None, False)
        busy = time.perf_counter() - started
        if failed is not None:
            return results, (0, 0, busy, failed, writing)
        return results, (1, len(ops), busy, None, writing)

    def _connection(self) -> sqlite3.Connection:
        if self.conn is None:
            self.conn = connect(self.path)
        return self.conn

    def _commit(self, ops: list[Op], fail_commit: bool) -> tuple[list[Result], str | None]:
        writing = any(kind == "w" for kind, _ in ops)
        try:
            conn = self._connection()
            conn.execute("BEGIN")
            values = _run_grouped(conn, ops)
            if writing and fail_commit:
                raise disk_full()  # as SQLite says it when the disk fills during COMMIT
            conn.execute("COMMIT")
        except Exception:
            self._roll_back()
            return self._one_by_one(ops, fail_commit)  # so that only the bad ones fail
        return [(OK, value) for value in values], None

    def _one_by_one(self, ops: list[Op], fail_commit: bool) -> tuple[list[Result], str | None]:
        """The batch again, each op in its own savepoint: the bad ones fail alone. A
        commit that fails fails every write of the batch: none was written, none is
        acknowledged; its reads run again on their own, so they never show what was not
        committed."""
        results: list[Result] = []
        writing = any(kind == "w" for kind, _ in ops)
        try:
            conn = self._connection()
            conn.execute("BEGIN")
            for kind, payload in ops:
                conn.execute("SAVEPOINT op")
                try:
                    value = _run(conn, kind, payload)
                except Exception as e:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append(_error(e))
                else:
                    conn.execute("RELEASE op")
                    results.append((OK, value))
            if writing and fail_commit:
                raise disk_full()
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._roll_back()
            failed = (NOT_COMMITTED, str(e), cause(e))
            reads = self._read_alone([op for op in ops if op[0] == "r"], failed)
            return [failed if kind == "w" else next(reads) for kind, _ in ops], cause(e)
        return results, None

    def _read_alone(self, reads: list[Op], failed: Result) -> Any:
        """Run reads in a transaction of their own (one view), after a failed commit."""
        results: list[Result] = []
        try:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                for kind, payload in reads:
                    try:
                        results.append((OK, _run(conn, kind, payload)))
                    except Exception as e:
                        results.append(_error(e))
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            self._roll_back()
            results = [failed] * len(reads)
        return iter(results)

    def _roll_back(self) -> None:
        """End a failed transaction. A connection that cannot even roll back is closed and
        opened again (SQLite then reads the database as it is on disk)."""
        conn = self.conn
        if conn is None:
            return
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            self.conn = None


def _error(e: Exception) -> Result:
    if isinstance(e, sqlite3.IntegrityError):
        return (CONFLICT, str(e), "")
    if isinstance(e, sqlite3.Error):
        return (FAILED, str(e), cause(e))
    return (BUG, repr(e), repr(e))


def _run(conn: sqlite3.Connection, kind: str, payload: list[tuple[str, Any]]) -> Any:
    if kind == "r":
        return [conn.execute(sql, params).fetchall() for sql, params in payload]
    for sql, rows in payload:
        if len(rows) == 1:
            conn.execute(sql, rows[0])
        else:
            conn.executemany(sql, rows)
    return None


def _run_grouped(conn: sqlite3.Connection, ops: list[Op]) -> list[Any]:
    """Run a batch with the statements of consecutive writes merged: each statement text
    once, over the rows of every write (writes in flight together touch different
    sessions, one write per session at a time). A read runs in its place, after the
    writes sent before it. Raises on the first error: the caller retries one by one."""
    values: list[Any] = []
    grouped: dict[str, list[Any]] = {}
    for kind, payload in ops:
        if kind == "w":
            for sql, rows in payload:
                grouped.setdefault(sql, []).extend(rows)
            values.append(None)
            continue
        _flush(conn, grouped)
        values.append(_run(conn, kind, payload))
    _flush(conn, grouped)
    return values


def _flush(conn: sqlite3.Connection, grouped: dict[str, list[Any]]) -> None:
    for sql, rows in grouped.items():
        conn.executemany(sql, rows)
    grouped.clear()


# --- the process ---------------------------------------------------------------------


def _die_with(parent: int) -> None:
    """Be killed when the node dies, however it dies (Linux); if it died already, go."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


class Inbox:
    """The frames the node sends, read off the socket (a blocking one)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.chunk = bytearray(CHUNK)  # reused: a fresh buffer a read cost the most
        self.view = memoryview(self.chunk)

    def receive(self) -> list[Any]:
        """Every frame that has come, waiting for the first; [] once the node closed its
        end (after the frames sent before it)."""
        frames = take_frames(self.buffer)
        while not frames:
            if self._read(0) == 0:
                return []
            frames = take_frames(self.buffer)
        # and whatever else came meanwhile: one commit for all of it (at the end of the
        # stream, these are answered first and the next receive says so)
        while self._read(socket.MSG_DONTWAIT) > 0:
            frames += take_frames(self.buffer)
        return frames

    def _read(self, flags: int) -> int:
        """Bytes read (0: the node closed its end; -1: none have come)."""
        try:
            n = self.sock.recv_into(self.chunk, CHUNK, flags)
        except BlockingIOError:
            return -1
        self.buffer += self.view[:n]
        return n


def main(argv: list[str]) -> int:
    path, parent, fd = argv[1], int(argv[2]), int(argv[3])
    _die_with(parent)
    # the node stops it (closing its end), not a signal to the process group: a terminal's
    # Ctrl-C or hang-up, or a supervisor's SIGTERM to every process of the service, must
    # let the node drain and close the store first
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    inbox = Inbox(sock)
    writer = Writer(path)
    while frames := inbox.receive():
        ops = [op for _, frame_ops in frames for op in frame_ops]
        answer = frame(writer.run(ops, any(fail for fail, _ in frames)))
        try:
            sock.sendall(answer)
        except BrokenPipeError:
            break  # the node is gone
    if writer.conn is not None:
        writer.conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
