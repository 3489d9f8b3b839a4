"""The embedded SQLite store: WAL, ``synchronous=FULL``, group commit.

A writer process owns the connection (``writer.py``: standard library only, started
with the store). Callers on the event loop queue operations (writes, as their
statements; reads, as queries); an op queued while the writer is idle goes to it at
once, and what one turn of the event loop queues while it commits goes in one frame; the
writer commits whatever frames have come as one transaction. The writes of a batch run
statement by statement across writes (one ``executemany`` for every write's session
update, one for every history item, ...), so a batch costs a few calls however many
writes it holds; a batch that fails runs again with a savepoint per operation, so that
only the bad ones fail. A commit is durable before any caller hears back, so batching
buys speed without trading durability.

The writer is a process and not a thread of the node's: in one process the two shared
one interpreter lock, which they held between them nearly all the time at 64 sessions
(bench/README.md). The writer holds the data directory's lock with the node and dies
with it; a writer that dies alone leaves every write's outcome unknown, so the store
refuses all calls from then on and calls ``on_lost`` (``dex server`` exits: its restart
recovers from what was committed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dex import _failpoints as failpoints
from dex.errors import Conflict, StorageError
from dex.server.store import writer
from dex.server.store.base import migrations
from dex.server.store.sql import SET_VERSION, VERSION, Query, SqlStore, Statement

log = logging.getLogger("dex.store")

LOCK_WAIT = 10.0
"""Seconds to wait for the lock of a node that died, while its writer dies after it."""


class SqliteStore(SqlStore):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.failing_since: float | None = None
        """Monotonic time of the first of the commits failing now; None while they succeed."""
        self.writer_pid: int | None = None
        self._lock_file: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._link: asyncio.Transport | None = None
        """The socket to the writer: None while closed, and once the writer is gone."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[writer.Op] = []
        """Ops queued in this turn of the event loop, sent together when it ends."""
        self._fail_commit = False
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        """One future for each op sent, in the order sent: the writer answers in order."""
        self._in = bytearray()
        self._closing = False
        self._gone: asyncio.Future[None] | None = None
        """Resolved once the writer's end is closed (it exited, or died)."""
        self._broken: StorageError | None = None
        """Why every call is refused: the writer died while the store was open."""

    # --- lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        await self._lock()
        try:
            await asyncio.to_thread(self._migrate)
            await self._start()
        except BaseException:
            await self.close()  # a store that failed to open refuses calls, never hangs them
            raise

    def _migrate(self) -> None:
        try:
            conn = writer.connect(str(self.path))
        except sqlite3.Error as e:
            raise StorageError(f"cannot open {self.path}: {e}") from e
        try:
            conn.execute("BEGIN IMMEDIATE")  # all of them, or none
            _migrate(conn)
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise StorageError(f"cannot migrate {self.path}: {writer.cause(e)}") from e
        finally:
            conn.close()

    async def _start(self) -> None:
        ours = self._spawn()
        self._broken = None
        self._loop = asyncio.get_running_loop()
        self._gone = self._loop.create_future()
        try:
            self._link, _ = await self._loop.create_unix_connection(lambda: _Link(self), sock=ours)
        except BaseException:
            ours.close()  # the writer reads the end of its input, and exits
            raise

    def _spawn(self) -> socket.socket:
        """Start the writer process; our end of the socket pair to it."""
        assert self._lock_file is not None
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    writer.__file__,
                    str(self.path),
                    str(os.getpid()),
                    str(theirs.fileno()),
                ],
                pass_fds=(theirs.fileno(), self._lock_file),  # the lock: held while it lives
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.writer_pid = self._process.pid
        return ours

    async def close(self) -> None:
        link, process = self._link, self._process
        if link is not None and self._gone is not None:
            self._send()  # what this turn of the loop queued
            self._closing = True
            link.write_eof()  # once all is sent: the writer answers what it has, then exits
            await self._gone  # every answer read, the writer's end closed
        self._process = None
        if process is not None:
            await asyncio.to_thread(process.wait)
        self._fail_all(StorageError("the store is closed", retryable=True))
        self._pending, self._in = [], bytearray()
        self._closing = False
        self._unlock()

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    async def _lock(self) -> None:
        """Hold an exclusive lock on ``<database>.lock`` while open: SQLite serves one node,
        and a second server on the same data would corrupt what the first one promised.
        The writer process holds it too; a node that died leaves it to its writer for the
        moment that one takes to die, which this waits out."""
        if self._lock_file is not None:
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StorageError(f"cannot open {self.lock_path}: {e}") from e
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if _alive(holder) or time.monotonic() > deadline:
                    os.close(fd)
                    raise StorageError(
                        f"{self.path} is in use by another Dex server (pid {holder}): SQLite "
                        "serves one node at a time. Stop that server first, or use PostgreSQL "
                        "(--database postgresql://...) to run several nodes."
                    ) from None
                await asyncio.sleep(0.01)  # its node is dead: its writer is dying
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_file = fd

    def _unlock(self) -> None:
        if self._lock_file is not None:
            fd, self._lock_file = self._lock_file, None
            os.close(fd)  # with the writer gone, closing it releases the lock

    # --- to and from the writer ---------------------------------------------------------

    def _queue(self, op: writer.Op, writing: bool) -> asyncio.Future[Any]:
        if self._link is None or self._loop is None or self._closing:
            raise self._broken or StorageError("the store is not open")
        idle = not self._waiting  # then it goes at once; else with this turn's others
        if not idle and not self._pending:
            self._loop.call_soon(self._send)
        if writing and not self._fail_commit:
            self._fail_commit = failpoints.failing("sqlite.commit")
        self._pending.append(op)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._waiting.append(fut)
        if idle:
            self._send()
        return fut

    def _send(self) -> None:
        ops, self._pending = self._pending, []
        fail, self._fail_commit = self._fail_commit, False
        if self._link is not None and ops:
            self._link.write(writer.frame((fail, ops)))  # the transport buffers what waits

    def _received(self, data: bytes) -> None:
        self._in += data
        for results, stats in writer.take_frames(self._in):
            self._account(*stats)
            for result in results:
                fut = self._waiting.popleft()
                if fut.done():
                    continue
                if result[0] == writer.OK:
                    fut.set_result(result[1])
                else:
                    fut.set_exception(_error(*result))

    def _account(
        self, commits: int, operations: int, busy: float, failed: str | None, writing: bool
    ) -> None:
        self.busy_seconds += busy
        if failed is not None:
            self.commit_failures += 1
            if self.failing_since is None:  # one line when commits start failing, not one each
                self.failing_since = time.monotonic()
                log.error(
                    "commit failed: %s; every write is refused until commits succeed again",
                    failed,
                    extra={"action": "store.commit_failed", "error": failed},
                )
            return
        if commits and writing and self.failing_since is not None:  # reads prove nothing
            log.warning(
                "commits succeed again after %.1fs of failures",
                time.monotonic() - self.failing_since,
                extra={"action": "store.commit_recovered", "failures": self.commit_failures},
            )
            self.failing_since = None
        self.commits += commits
        self.operations += operations

    def _lost(self) -> None:
        """The writer's end closed. Asked to (``close``), or it died while the store was
        open: then what it was writing may or may not be committed, so nothing is
        answered as if it were known."""
        assert self._gone is not None
        self._link = None
        self._gone.set_result(None)
        if self._closing:
            return
        code = self._process.poll() if self._process is not None else None
        log.critical(
            "the SQLite writer process died (exit status %s): writes in flight may or may not "
            "be committed; the store refuses every call",
            code,
            extra={"action": "store.writer_lost", "exit_status": code},
        )
        self._broken = StorageError(
            "the store's writer process died: this node can no longer write; restart it",
            retryable=True,
        )
        self._fail_all(self._broken)
        if self.on_lost is not None:
            self.on_lost()

    def _fail_all(self, error: StorageError) -> None:
        waiting, self._waiting = self._waiting, collections.deque()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(error)

    # --- the executor hooks ----------------------------------------------------------

    def _commit_write(
        self, statements: list[Statement], session_id: str | None
    ) -> asyncio.Future[None]:
        return self._queue(("w", statements), writing=True)

    async def _read(self, queries: list[Query]) -> list[list[tuple[Any, ...]]]:
        # the writer runs them back to back: one consistent view
        rows: list[list[tuple[Any, ...]]] = await self._queue(("r", queries), writing=False)
        return rows

    async def schema_version(self) -> int:
        [rows] = await self._read([(VERSION, ())])
        return int(rows[0][0]) if rows else 0


class _Link(asyncio.Protocol):
    """The store's end of the socket to its writer process."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def data_received(self, data: bytes) -> None:
        self.store._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.store._lost()  # the writer exited, or died


def _alive(pid: str) -> bool:
    """Whether the process that wrote the lock file runs (a node, not its dying writer)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _error(kind: int, message: str, cause: str) -> Exception:
    """A writer's answer as a Dex error whose message names no table, column or
    statement (the driver's own words go to the log)."""
    if kind == writer.CONFLICT:
        log.warning("write refused", extra={"action": "store.conflict", "error": message})
        return Conflict("the write conflicts with what is stored")
    if kind == writer.NOT_COMMITTED:
        return StorageError(
            f"the store could not commit: {cause}. Nothing was written; try again",
            retryable=True,
            cause=cause,
        )
    if kind == writer.BUG:
        log.error("the writer failed a batch: %s", message, extra={"action": "store.bug"})
        return StorageError(f"the store failed: {message}", retryable=True)
    log.error("write failed", extra={"action": "store.error", "error": message})
    return StorageError(
        f"the store could not complete the operation: {cause}. Nothing was written; try again",
        retryable=True,
        cause=cause,
    )


def _version(conn: sqlite3.Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = conn.execute(VERSION).fetchone()
    return int(row[0]) if row else 0


def _migrate(conn: sqlite3.Connection) -> None:
    current = _version(conn)
    for number, sql in migrations("sqlite"):
        if number <= current:
            continue
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(SET_VERSION, (str(number),))
