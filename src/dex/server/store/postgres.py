"""The PostgreSQL store: pipelined group commit on one writer connection, reads from a
small pool, migrations under an advisory lock, and the lease fence on every batch.

The writer task takes every ``Write`` queued, sends the whole batch (``BEGIN``, the
fence check, each write's statements, ``COMMIT``) as one pipeline, and answers each
caller after the commit. A batch that fails is run again with a savepoint per write, so
the bad write fails alone and the rest commit. A connection lost while a batch was in
flight raises ``CommitUnknown``: the ``COMMIT`` may have been applied.
``synchronous_commit`` is set ``on`` for the writer: a commit is durable before anyone
hears of it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, LiteralString

import psycopg
from psycopg_pool import AsyncConnectionPool

from dex import _failpoints as failpoints
from dex.errors import CommitUnknown, Conflict, Fenced, StorageError, Unavailable
from dex.server.store.base import migrations
from dex.server.store.partitions import DEFAULT_PARTITIONS, MAX_PARTITIONS, partition_of
from dex.server.store.sql import (
    ADD_TENANT_USAGE,
    INSERT_HISTORY,
    INSERT_MESSAGE,
    INSERT_TURN,
    SET_VERSION,
    UPDATE_SESSION,
    UPSERT_CALL,
    UPSERT_STEP,
    VERSION,
    Query,
    SqlStore,
    Statement,
    add_up,
)

log = logging.getLogger("dex.store")

LEADER_KEY = 4601000001
"""The session advisory lock of the standby that may take partitions when no other node
serves (``dex.server.ha.lease``)."""
NODE_LOCKS = 4610
"""``(NODE_LOCKS, key)``: held by each live node on its lock connection."""
PARTITION_LOCKS = 4611
"""``(PARTITION_LOCKS, id)``: held by the node that owns partition ``id``."""
FENCE_LOCKS = 4612
"""``(FENCE_LOCKS, id)``: taken shared by every write batch to partition ``id``,
exclusively by a node bumping its epoch (the number is also in migration 0005's
``dex_fence_partitions``)."""
MIGRATE_KEY = 4601000003
"""Held while migrations run, so that two nodes starting at once run each file once."""
FENCED_SQLSTATE = "DXF01"
UNIQUE_VIOLATION = "23505"

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
Cursor = psycopg.AsyncCursor[tuple[Any, ...]]
Pending = tuple[list[Statement], "asyncio.Future[None]", int | None]
"""A write's statements, its caller's future, and the partition it writes to (None: no
session's, an agent)."""

CONNECT_OPTIONS: dict[str, Any] = {
    "application_name": "dex",
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
"""Detect a dead server or network within seconds instead of the kernel's hours."""


BULK: dict[str, tuple[LiteralString, tuple[int, ...], tuple[type, ...]]] = {
    UPDATE_SESSION: (
        "UPDATE sessions SET status = v.status, turn = v.turn, state = v.state, "
        "updated_at = v.updated_at, waiting_since = v.waiting_since, "
        "outcome_unknown = v.outcome_unknown, input_tokens = v.input_tokens, "
        "output_tokens = v.output_tokens, cost_usd = v.cost_usd FROM unnest(%b::text[], "
        "%b::int[], %b::text[], %b::float8[], %b::float8[], %b::int[], %b::int8[], "
        "%b::int8[], %b::float8[], %b::text[]) AS v(status, turn, state, updated_at, "
        "waiting_since, outcome_unknown, input_tokens, output_tokens, cost_usd, id) "
        "WHERE sessions.id = v.id",
        (9,),
        (str, int, str, float, float, int, int, int, float, str),
    ),
    INSERT_MESSAGE: (
        "INSERT INTO messages (session_id, message_id, number, outcome, interrupted) "
        "SELECT * FROM unnest(%b::text[], %b::text[], %b::int[], %b::text[], %b::int[])",
        (),
        (str, str, int, str, int),
    ),
    INSERT_HISTORY: (
        "INSERT INTO history (session_id, seq, item) "
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::text[])",
        (),
        (str, int, str),
    ),
    UPSERT_STEP: (
        "INSERT INTO steps (session_id, turn, seq, step) "
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::int[], %b::text[]) "
        "ON CONFLICT (session_id, turn, seq) DO UPDATE SET step = excluded.step",
        (0, 1, 2),
        (str, int, int, str),
    ),
    UPSERT_CALL: (
        "INSERT INTO calls (session_id, turn, seq, call) "
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::int[], %b::text[]) "
        "ON CONFLICT (session_id, turn, seq) DO UPDATE SET call = excluded.call",
        (0, 1, 2),
        (str, int, int, str),
    ),
    INSERT_TURN: (
        "INSERT INTO turns (session_id, number, status, turn) "
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::text[], %b::text[])",
        (),
        (str, int, str, str),
    ),
}
"""The statements a group commit sends once for the rows of every write in the batch: the
rows as one array a column, ``unnest``ed (one statement for PostgreSQL to run and for
psycopg to encode, instead of one a row). Writes in one batch touch different sessions
(a session's next write waits for its last commit), as SQLite's group commit also relies
on. ``key``: the columns naming the row an UPDATE or upsert changes; rows repeating a key
go one by one, in order (one statement may change a row only once). A repeated key of a
plain INSERT fails as it would row by row, and the batch is retried write by write. Then
each column's Python type: an array holds values of one type (an int among floats would
not encode)."""


@functools.cache
def pg(sql: str) -> LiteralString:
    """A shared query (``?`` placeholders) in psycopg's style."""
    return sql.replace("?", "%s")


async def connect(url: str, **options: Any) -> Conn:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=True, **{**CONNECT_OPTIONS, **options}
        )
    except psycopg.Error as e:
        raise StorageError(f"cannot connect to PostgreSQL: {e}", retryable=True) from e


class PostgresStore(SqlStore):
    dialect = "postgresql"

    def __init__(
        self, url: str, *, read_connections: int = 4, partitions: int = DEFAULT_PARTITIONS
    ) -> None:
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be between 1 and {MAX_PARTITIONS}")
        self.url = url
        self.read_connections = read_connections
        self.partitions_wanted = partitions
        """How many partitions a database this store creates gets (``--partitions``)."""
        self.partition_count = partitions
        """How many the database has: read from it on ``open``."""
        self.on_fatal: Callable[[StorageError], None] | None = None
        """Called when a batch is refused by the fence (``Fenced``) or its outcome is
        unknown (``CommitUnknown``): the node must step down (the server sets the lease's
        ``lose`` here)."""
        self._conn: Conn | None = None
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._queue: asyncio.Queue[Pending | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        try:
            self._conn = await self._connect_writer()
            await _migrate(self._conn, self.partitions_wanted)
            cur = await self._conn.execute("SELECT count(*) FROM dex_partitions")
            row = await cur.fetchone()
            self.partition_count = int(row[0]) if row else 0
            self._pool = AsyncConnectionPool(
                self.url,
                min_size=1,
                max_size=self.read_connections,
                kwargs={"autocommit": True, **CONNECT_OPTIONS},
                open=False,
                name="dex-read",
                # a connection that died (PostgreSQL restarted) is replaced, not handed out
                check=AsyncConnectionPool.check_connection,
            )
            await self._pool.open(wait=True, timeout=10)
        except BaseException as e:
            await self._close_connections()
            if isinstance(e, psycopg.Error):
                raise StorageError(f"cannot open the PostgreSQL store: {e}") from e
            raise
        self._queue = asyncio.Queue()
        self._writer = asyncio.create_task(self._run(), name="dex-postgres-writer")

    async def close(self) -> None:
        if self._writer is not None:
            # Refuse new calls at once; what was queued before is still committed.
            writer, self._writer = self._writer, None
            self._queue.put_nowait(None)
            await writer
        await self._close_connections()

    async def _close_connections(self) -> None:
        conn, self._conn = self._conn, None
        pool, self._pool = self._pool, None
        if conn is not None:
            await conn.close()
        if pool is not None:
            await pool.close()

    async def _connect_writer(self) -> Conn:
        conn = await connect(self.url)
        try:
            await conn.execute("SET synchronous_commit TO on")  # never lower it
            # A transaction left idle this long is ended by PostgreSQL, and its fence lock
            # with it. That covers the one-by-one retry (a Sync after every statement), not
            # a pipelined batch: with no Sync sent yet, PostgreSQL counts its session as
            # active however long the node is stopped. A new leader ends those itself
            # (``LeaseSettings.fence_wait``).
            await conn.execute("SET idle_in_transaction_session_timeout TO '3s'")
            # No wait without end: a batch waits for a partition's fence lock only while
            # another node takes the partition (a bump takes milliseconds, or is ended).
            await conn.execute("SET lock_timeout TO '5s'")
        except psycopg.Error as e:
            await conn.close()
            raise StorageError(f"cannot set up the writer connection: {e}", retryable=True) from e
        return conn

    # --- the writer task -------------------------------------------------------------

    def _commit_write(
        self, statements: list[Statement], session_id: str | None
    ) -> asyncio.Future[None]:
        if self._writer is None:
            raise StorageError("the store is not open")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        partition = None
        if session_id is not None and self.fence is not None:
            partition = partition_of(session_id, self.partition_count)
            if partition not in self.fence:  # handed over, or never this node's
                fut.set_exception(
                    Unavailable(
                        f"session {session_id!r} is served by another node now: try again",
                        session_id=session_id,
                    )
                )
                return fut
        self._queue.put_nowait((statements, fut, partition))
        return fut

    async def _run(self) -> None:
        stop = False
        while not stop:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stop = True
                    break
                batch.append(item)
            batch = self._still_owned(batch)
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await self._commit(batch)
            except Exception as e:  # a bug here must not leave callers waiting forever
                log.exception("group commit failed", extra={"action": "store.commit_failed"})
                results = [StorageError(f"commit failed: {e}")] * len(batch)
            self.busy_seconds += time.perf_counter() - started
            fatal = next((e for e in results if isinstance(e, Fenced | CommitUnknown)), None)
            if fatal is not None and self.on_fatal is not None:
                self.on_fatal(fatal)
            for (_, fut, _), error in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)

    def _still_owned(self, batch: list[Pending]) -> list[Pending]:
        """The batch without the writes to partitions this node handed over since they
        were queued: each of those is refused alone (``Unavailable``), not the batch."""
        fence = self.fence
        if fence is None:
            return batch
        kept = []
        for item in batch:
            partition, fut = item[2], item[1]
            if partition is None or partition in fence:
                kept.append(item)
            elif not fut.done():
                fut.set_exception(Unavailable("the session is served by another node now"))
        return kept

    async def _commit(self, batch: list[Pending]) -> list[Exception | None]:
        n = len(batch)
        fence = self._fence_of(batch)
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await self._connect_writer()
        except StorageError as e:
            return [e] * n
        conn = self._conn
        try:
            async with conn.pipeline():
                cur = conn.cursor()
                await cur.execute("BEGIN")
                if fence is not None:
                    await cur.execute(FENCE, fence)
                    failpoints.hit("store.in_fenced_batch")  # the fence is sent, COMMIT not
                await _execute_grouped(cur, batch)
                await cur.execute("COMMIT")
        except psycopg.Error as e:
            if conn.broken or conn.closed:
                return [self._unknown(e)] * n
            if not await self._rollback(conn):
                return [StorageError(f"commit failed: {e}", retryable=True)] * n
            if e.sqlstate == FENCED_SQLSTATE or n == 1:
                return [_translate(e)] * n
            return await self._one_by_one(conn, batch, fence)
        self.commits += 1
        self.operations += n
        return [None] * n

    def _fence_of(self, batch: list[Pending]) -> tuple[list[int], list[int]] | None:
        """The partitions the batch writes to and the epochs this node took them with, for
        ``dex_fence_partitions`` (None: nothing to check). A partition handed over since
        its write was queued was left out of the batch (``_still_owned``)."""
        if self.fence is None:
            return None
        parts = sorted({p for _, _, p in batch if p is not None})
        if not parts:
            return None
        return parts, [self.fence[p] for p in parts]

    async def _one_by_one(
        self, conn: Conn, batch: list[Pending], fence: tuple[list[int], list[int]] | None
    ) -> list[Exception | None]:
        """The batch again, each write in its own savepoint: the bad ones fail alone."""
        results: list[Exception | None] = []
        committing = False
        try:
            cur = conn.cursor()
            await cur.execute("BEGIN")
            if fence is not None:
                await cur.execute(FENCE, fence)
            for statements, _, _ in batch:
                await cur.execute("SAVEPOINT op")
                try:
                    await _execute(cur, statements)
                except psycopg.Error as e:
                    if conn.broken or conn.closed:
                        raise
                    await cur.execute("ROLLBACK TO SAVEPOINT op")
                    results.append(_translate(e))
                else:
                    await cur.execute("RELEASE SAVEPOINT op")
                    results.append(None)
            committing = True
            await cur.execute("COMMIT")
        except psycopg.Error as e:
            if committing and (conn.broken or conn.closed):
                return [self._unknown(e)] * len(batch)
            await self._rollback(conn)
            return [_translate(e)] * len(batch)
        self.commits += 1
        self.operations += len(batch)
        return results

    def _unknown(self, e: psycopg.Error) -> CommitUnknown:
        self._conn = None
        log.error("connection lost during a commit", extra={"action": "store.commit_unknown"})
        return CommitUnknown(f"the connection was lost during a commit: {e}", retryable=False)

    async def _rollback(self, conn: Conn) -> bool:
        """End a failed transaction; False when the connection is no longer usable."""
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await conn.execute("ROLLBACK")
        except psycopg.Error:
            self._conn = None
            await conn.close()
            return False
        return True

    # --- reads -----------------------------------------------------------------------

    async def _read(self, queries: list[Query]) -> list[list[tuple[Any, ...]]]:
        pool = self._pool
        if pool is None or self._writer is None:
            raise StorageError("the store is not open")
        try:
            async with pool.connection() as conn:
                if len(queries) == 1:
                    [(sql, params)] = queries
                    cur = await conn.execute(pg(sql), params)
                    return [await cur.fetchall()]
                # one snapshot, one round trip
                async with conn.pipeline():
                    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    cursors = [await conn.execute(pg(sql), params) for sql, params in queries]
                    await conn.execute("COMMIT")
                return [await cur.fetchall() for cur in cursors]
        except psycopg.Error as e:
            raise StorageError(f"read failed: {e}", retryable=True) from e

    async def exchange_demand(
        self, node: str, demand: dict[str, int], at: float, since: float
    ) -> list[tuple[str, str, int]] | None:
        pool = self._pool
        if pool is None:
            raise StorageError("the store is not open")
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(EXCHANGE_DEMAND, (node, at, list(demand), list(demand.values())))
                cur = await conn.execute(OTHERS_DEMAND, (since, node))
                return [(str(n), str(g), int(d)) for n, g, d in await cur.fetchall()]
        except psycopg.Error as e:
            raise StorageError(f"exchanging the limits' demand failed: {e}", retryable=True) from e

    async def schema_version(self) -> int:
        rows = await self._rows(VERSION)
        return int(rows[0][0]) if rows else 0


async def _execute_grouped(cur: Cursor, batch: list[Pending]) -> None:
    """Every write of the batch, each statement text once over the rows of all (``BULK``)."""
    grouped: dict[str, list[tuple[Any, ...]]] = {}
    for statements, _, _ in batch:
        for sql, rows in statements:
            grouped.setdefault(sql, []).extend(rows)
    if usage := grouped.get(ADD_TENANT_USAGE):
        grouped[ADD_TENANT_USAGE] = add_up(usage)
    for sql, rows in grouped.items():
        bulk = BULK.get(sql)
        if bulk is None or len(rows) == 1 or _repeats(rows, bulk[1]):
            await _execute(cur, [(sql, rows)])
            continue
        query, _, types = bulk
        columns = zip(types, zip(*rows, strict=True), strict=True)
        await cur.execute(query, [[v if v is None else t(v) for v in c] for t, c in columns])


def _repeats(rows: list[tuple[Any, ...]], key: tuple[int, ...]) -> bool:
    if not key:
        return False
    return len({tuple(row[i] for i in key) for row in rows}) < len(rows)


async def _execute(cur: Cursor, statements: list[Statement]) -> None:
    for sql, rows in statements:
        if len(rows) == 1:
            await cur.execute(pg(sql), rows[0])
        else:
            await cur.executemany(pg(sql), rows)


def _translate(e: psycopg.Error) -> Exception:
    """A driver error as a Dex error whose message names no table, column or statement
    (the driver's own words go to the log)."""
    if e.sqlstate == UNIQUE_VIOLATION:
        log.warning("write refused", extra={"action": "store.conflict", "error": str(e)})
        return Conflict("the write conflicts with what is stored")
    if e.sqlstate == FENCED_SQLSTATE:
        return Fenced(str(e.diag.message_primary or e))
    log.error("write failed", extra={"action": "store.error", "error": str(e)})
    return StorageError("the store could not complete the operation", retryable=True)


FENCE = "SELECT dex_fence_partitions(%s, %s)"
EXCHANGE_DEMAND = (
    "INSERT INTO dex_limit_demand (node, grp, demand, at) "
    "SELECT %s, g, d, %s FROM unnest(%s::text[], %s::integer[]) AS t(g, d) "
    "ON CONFLICT (node, grp) DO UPDATE SET demand = excluded.demand, at = excluded.at"
)
OTHERS_DEMAND = "SELECT node, grp, demand FROM dex_limit_demand WHERE at > %s AND node <> %s"
PARTITIONS_AT = 5
"""The migration that creates the partitions (``0005_partitions.sql``)."""


async def _migrate(conn: Conn, partitions: int = DEFAULT_PARTITIONS) -> None:
    """Run pending migrations, each file whole in its own transaction, one node at a time.
    A database that does not have partitions yet gets ``partitions`` of them."""
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_KEY,))
    try:
        await conn.execute(
            'CREATE TABLE IF NOT EXISTS meta (key TEXT COLLATE "C" PRIMARY KEY, '
            "value TEXT NOT NULL)"
        )
        cur = await conn.execute(VERSION)
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        if current < PARTITIONS_AT:
            await conn.execute(
                "INSERT INTO meta (key, value) VALUES ('partitions', %s) "
                "ON CONFLICT (key) DO NOTHING",
                (str(partitions),),
            )
        for number, sql in migrations("postgresql"):
            if number <= current:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(pg(SET_VERSION), (str(number),))
    finally:
        if not conn.closed:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_KEY,))
