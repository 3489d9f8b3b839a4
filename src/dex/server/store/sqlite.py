"""The embedded SQLite store: WAL, ``synchronous=FULL``, group commit.

One thread owns the connection. Callers on the event loop queue operations (writes,
as their statements; reads, as functions); the thread takes everything queued and
commits it as one transaction. The writes of a batch run statement by statement across
writes (one ``executemany`` for every write's session update, one for every history
item, ...), so a batch costs a few calls however many writes it holds; a batch that
fails runs again with a savepoint per operation, so that only the bad ones fail. A
commit is durable before any caller hears back, so batching buys speed without
trading durability.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dex import _failpoints as failpoints
from dex.errors import Conflict, StorageError
from dex.server.store.base import migrations
from dex.server.store.sql import SET_VERSION, VERSION, Query, SqlStore, Statement

log = logging.getLogger("dex.store")
T = TypeVar("T")
Op = Callable[[sqlite3.Connection], Any]
Pending = tuple[Op | None, list[Statement], asyncio.Future[Any]]
"""A queued operation: a read (a function of the connection) or a write (statements)."""
Results = list[tuple[asyncio.Future[Any], Any, BaseException | None]]


class SqliteStore(SqlStore):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.commits = 0
        """How many transactions committed: with ``operations``, shows how well commits group."""
        self.operations = 0
        self.busy_seconds = 0.0
        """Wall time the writer spent on batches: over elapsed time, how busy the one
        writer is (it commits in series, so at 1.0 it sets the node's pace)."""
        self.commit_failures = 0
        """Batches whose commit failed (a full disk, an I/O error): nothing of them written."""
        self.failing_since: float | None = None
        """Monotonic time of the first of the commits failing now; None while they succeed."""
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None

    # --- lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock()
        self._loop = asyncio.get_running_loop()
        self._queue = queue.SimpleQueue()  # nothing left over from an earlier open
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="dex-sqlite", daemon=True
        )
        self._thread.start()
        try:
            await ready
            await self._call(_migrate)
        except BaseException:
            await self.close()  # a store that failed to open refuses calls, never hangs them
            raise

    async def close(self) -> None:
        if self._thread is not None:
            # Refuse new calls at once: one queued behind the stop would never be answered.
            thread, self._thread = self._thread, None
            self._queue.put(None)
            await asyncio.to_thread(thread.join)
        self._unlock()

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def _lock(self) -> None:
        """Hold an exclusive lock on ``<database>.lock`` while open: SQLite serves one node,
        and a second server on the same data would corrupt what the first one promised."""
        if self._lock_fd is not None:
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(f"cannot open {self.lock_path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StorageError(
                f"{self.path} is in use by another Dex server (pid {holder}): SQLite serves "
                "one node at a time. Stop that server first, or use PostgreSQL "
                "(--database postgresql://...) to run several nodes."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)  # closing the descriptor releases the lock

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    # --- the writer thread ------------------------------------------------------

    def _run(self, ready: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            self._conn = self._connect()
        except sqlite3.Error as e:
            loop.call_soon_threadsafe(
                ready.set_exception, StorageError(f"cannot open {self.path}: {e}")
            )
            return
        loop.call_soon_threadsafe(ready.set_result, None)
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            started = time.perf_counter()
            try:
                results = self._commit(batch)
            except Exception as e:  # a bug: the writer must still answer, and live on
                log.exception("the writer failed a batch", extra={"action": "store.bug"})
                self._roll_back()
                failed = StorageError(f"the store failed: {e!r}", retryable=True)
                results = [(fut, None, failed) for _, _, fut in batch]
            self.busy_seconds += time.perf_counter() - started
            loop.call_soon_threadsafe(_deliver, results)
        if self._conn is not None:
            self._conn.close()

    def _commit(self, batch: list[Pending]) -> Results:
        writing = any(op is None for op, _, _ in batch)
        try:
            conn = self._conn or self._reconnect()
            conn.execute("BEGIN")
            values = _run_grouped(conn, batch)
            if writing and failpoints.failing("sqlite.commit"):
                raise _disk_full()  # as SQLite says it when the disk fills during COMMIT
            conn.execute("COMMIT")
        except Exception:
            self._roll_back()
            return self._one_by_one(batch)  # so that only the bad ones fail
        self._committed(writing, len(batch))
        return [(fut, value, None) for (_, _, fut), value in zip(batch, values, strict=True)]

    def _one_by_one(self, batch: list[Pending]) -> Results:
        """The batch again, each operation in its own savepoint: the bad ones fail alone.
        A commit that fails (a full disk, an I/O error) fails every write of the batch:
        none was written, none is acknowledged; its reads run again on their own, so they
        never show what was not committed. The writer never dies of it, and commits
        resume by themselves once the cause is gone."""
        results: Results = []
        writing = any(op is None for op, _, _ in batch)
        try:
            conn = self._conn or self._reconnect()
            conn.execute("BEGIN")
            for op, statements, fut in batch:
                conn.execute("SAVEPOINT op")
                try:
                    if op is None:
                        _execute(conn, statements)
                        value = None
                    else:
                        value = op(conn)
                except Exception as e:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((fut, None, _translate(e)))
                else:
                    conn.execute("RELEASE op")
                    results.append((fut, value, None))
            if writing and failpoints.failing("sqlite.commit"):
                raise _disk_full()
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._roll_back()
            self._failed(e)
            error = StorageError(
                f"the store could not commit: {_cause(e)}. Nothing was written; try again",
                retryable=True,
                cause=_cause(e),
            )
            writes = [(fut, None, error) for op, _, fut in batch if op is None]
            reads = [item for item in batch if item[0] is not None]
            return writes + self._read_alone(reads, error)
        self._committed(writing, len(batch))
        return results

    def _read_alone(self, reads: list[Pending], error: StorageError) -> Results:
        """Run reads in a transaction of their own (one view), after a failed commit; one
        that changed something (a migration) was a write: it fails with the batch."""
        if not reads:
            return []
        results: Results = []
        try:
            conn = self._conn or self._reconnect()
            conn.execute("BEGIN")
            try:
                for op, _, fut in reads:
                    assert op is not None
                    changes = conn.total_changes
                    try:
                        value = op(conn)
                    except Exception as e:
                        results.append((fut, None, _translate(e)))
                        continue
                    if conn.total_changes != changes:
                        results.append((fut, None, error))
                    else:
                        results.append((fut, value, None))
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            self._roll_back()
            return [(fut, None, error) for _, _, fut in reads]
        return results

    def _committed(self, writing: bool, operations: int) -> None:
        if writing and self.failing_since is not None:
            log.warning(
                "commits succeed again after %.1fs of failures",
                time.monotonic() - self.failing_since,
                extra={"action": "store.commit_recovered", "failures": self.commit_failures},
            )
            self.failing_since = None
        self.commits += 1
        self.operations += operations

    def _failed(self, e: sqlite3.Error) -> None:
        self.commit_failures += 1
        if self.failing_since is None:  # one line when commits start failing, not one each
            self.failing_since = time.monotonic()
            log.error(
                "commit failed: %s; every write is refused until commits succeed again",
                _cause(e),
                extra={"action": "store.commit_failed", "error": str(e)},
            )

    def _roll_back(self) -> None:
        """End a failed transaction. A connection that cannot even roll back is closed and
        opened again (SQLite then reads the database as it is on disk)."""
        conn = self._conn
        if conn is None:
            return
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            log.warning(
                "rollback failed (%s): opening the database again",
                e,
                extra={"action": "store.reconnect"},
            )
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            self._conn = None

    def _reconnect(self) -> sqlite3.Connection:
        self._conn = self._connect()
        return self._conn

    async def _call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._loop is None or self._thread is None:
            raise StorageError("the store is not open")
        fut: asyncio.Future[T] = self._loop.create_future()
        self._queue.put((op, [], fut))
        return await fut

    # --- the executor hooks ----------------------------------------------------------

    def _commit_write(self, statements: list[Statement]) -> asyncio.Future[None]:
        if self._loop is None or self._thread is None:
            raise StorageError("the store is not open")
        fut: asyncio.Future[None] = self._loop.create_future()
        self._queue.put((None, statements, fut))
        return fut

    async def _read(self, queries: list[Query]) -> list[list[tuple[Any, ...]]]:
        # the writer thread runs them back to back: one consistent view
        return await self._call(lambda conn: [conn.execute(q, p).fetchall() for q, p in queries])

    async def schema_version(self) -> int:
        return await self._call(_version)


def _deliver(results: Results) -> None:
    for fut, value, error in results:
        if fut.done():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)


def _translate(e: Exception) -> Exception:
    """A driver error as a Dex error whose message names no table, column or statement
    (the driver's own words go to the log)."""
    if isinstance(e, sqlite3.IntegrityError):
        log.warning("write refused", extra={"action": "store.conflict", "error": str(e)})
        return Conflict("the write conflicts with what is stored")
    if isinstance(e, sqlite3.Error):
        log.error("write failed", extra={"action": "store.error", "error": str(e)})
        return StorageError(
            f"the store could not complete the operation: {_cause(e)}. Nothing was written; "
            "try again",
            retryable=True,
            cause=_cause(e),
        )
    return e


_CAUSES = {
    5: "the database is locked by another process",
    8: "the database is read-only",
    10: "a disk I/O error",
    11: "the database file is corrupt",
    13: "the disk is full",
    14: "the database file cannot be opened",
}
"""SQLite's primary result codes, as an operator would name the problem."""


def _cause(e: sqlite3.Error) -> str:
    """What went wrong, in an operator's words, without table or statement names."""
    code = getattr(e, "sqlite_errorcode", None)
    name = getattr(e, "sqlite_errorname", None) or "a storage error"
    if code is None:
        return str(e)
    return _CAUSES.get(code & 0xFF, f"SQLite error {name}")


def _disk_full() -> sqlite3.OperationalError:
    """The error SQLite raises when the disk fills (SQLITE_FULL): the ``sqlite.commit``
    failpoint raises it where a real full disk does."""
    e = sqlite3.OperationalError("database or disk is full")
    e.sqlite_errorcode = sqlite3.SQLITE_FULL
    e.sqlite_errorname = "SQLITE_FULL"
    return e


def _execute(conn: sqlite3.Connection, statements: list[Statement]) -> None:
    for sql, rows in statements:
        if len(rows) == 1:
            conn.execute(sql, rows[0])
        else:
            conn.executemany(sql, rows)


def _run_grouped(conn: sqlite3.Connection, batch: list[Pending]) -> list[Any]:
    """Run a batch with the statements of consecutive writes merged: each statement text
    once, over the rows of every write (writes in flight together touch different
    sessions, one write per session at a time). A read runs in its place, after the
    writes queued before it. Raises on the first error: the caller retries one by one."""
    values: list[Any] = []
    grouped: dict[str, list[tuple[Any, ...]]] = {}
    for op, statements, _ in batch:
        if op is None:
            for sql, rows in statements:
                grouped.setdefault(sql, []).extend(rows)
            values.append(None)
            continue
        _flush(conn, grouped)
        values.append(op(conn))
    _flush(conn, grouped)
    return values


def _flush(conn: sqlite3.Connection, grouped: dict[str, list[tuple[Any, ...]]]) -> None:
    for sql, rows in grouped.items():
        conn.executemany(sql, rows)
    grouped.clear()


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
