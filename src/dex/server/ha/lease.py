"""Leadership: a session advisory lock on a dedicated connection, and an epoch row.

The active node holds ``pg_try_advisory_lock(LEADER_KEY)`` on a connection of its own,
pings it about every 500 ms, and asks PostgreSQL to end the session when it goes quiet
(``idle_session_timeout``, keepalives and ``tcp_user_timeout`` set per session): a killed
holder frees the lock at once, a hung or cut-off one within ``session_timeout``. On
winning, a node bumps ``dex_lease.epoch`` in the transaction that holds the fence lock
(``pg_advisory_xact_lock(FENCE_KEY)``) exclusively; the store of a node checks that epoch
on every write batch (``PostgresStore.fence_epoch``), so an old leader that still runs
can commit nothing after the takeover.

``valid_until`` is a monotonic deadline, refreshed by each successful ping, shorter than
the time a standby needs to win: what a node answers from memory (a heartbeat reply, a
single-attempt start) it answers only before that deadline. Times stored come from the
database's ``now()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from dex.errors import StorageError
from dex.server.clock import Clock
from dex.server.store.postgres import FENCE_KEY, LEADER_KEY

log = logging.getLogger("dex.ha")

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

BUMP = (
    "UPDATE dex_lease SET epoch = epoch + 1, holder = %s, acquired_at = now() "
    "WHERE id = 1 RETURNING epoch"
)


@dataclass(frozen=True)
class LeaseSettings:
    ping_interval: float = 0.5
    """Seconds between two pings of the lock connection."""
    ping_timeout: float = 1.0
    """A ping that takes longer loses the lease."""
    retry_interval: float = 0.25
    """How often a standby tries to take the lock."""
    session_timeout: float = 3.0
    """How long PostgreSQL keeps a silent holder's session (and so the lock): its
    ``idle_session_timeout``, ``tcp_user_timeout`` and keepalive window."""
    margin: float = 1.0
    """Of ``session_timeout``, what ``valid_until`` leaves unused (for slow pings and
    clock rates)."""

    def __post_init__(self) -> None:
        if not 0 < self.margin < self.session_timeout:
            raise ValueError("LeaseSettings: margin must be between 0 and session_timeout")
        if self.ping_interval + self.ping_timeout >= self.valid_for:
            raise ValueError("LeaseSettings: a ping must come back within valid_for")

    @property
    def valid_for(self) -> float:
        """Seconds after a ping was sent that the lease is surely still held: a standby
        cannot win before PostgreSQL ends this session, ``session_timeout`` after its
        last sign of life (an operator's ``pg_terminate_backend`` aside: fencing covers
        that)."""
        return self.session_timeout - self.margin


class Lease:
    """The PostgreSQL ``Leadership`` (``dex.server.ha.leadership``): ``await acquire()``
    (the new epoch), ``lost`` (an event), ``valid()``, ``await release()``."""

    def __init__(
        self,
        url: str,
        holder: str | None = None,
        settings: LeaseSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.url = url
        self.clock = clock
        """Corrected to the database's clock at every ping (the node's durable deadlines)."""
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.settings = settings or LeaseSettings()
        self.epoch: int | None = None
        self.lost = asyncio.Event()
        """Set when the lock connection dies or a ping fails: stop at once."""
        self.valid_until = 0.0
        """``time.monotonic()`` before which the lease is surely held."""
        self._conn: Conn | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None

    def valid(self) -> bool:
        """Whether the lock is surely still held now (``Leadership.valid``)."""
        return not self.lost.is_set() and time.monotonic() < self.valid_until

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend that holds the lock (for operators and tests)."""
        return self._conn.info.backend_pid if self._conn is not None else None

    async def acquire(self) -> int:
        """Wait until this node holds the lock, bump the epoch, start pinging. Returns the
        new epoch."""
        if self._pinger is not None:
            raise RuntimeError("the lease is held already")
        conn: Conn | None = None
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = await self._connect()
                    cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_KEY,))
                    row = await cur.fetchone()
                    if row is not None and row[0]:
                        sent = time.monotonic()
                        epoch = await self._bump(conn)
                        await self._read_clock(conn)  # right before recovery arms timers
                        break
                except psycopg.Error as e:
                    log.warning(
                        "lease: cannot reach PostgreSQL: %s", e, extra={"action": "lease.retry"}
                    )
                    if conn is not None:
                        await conn.close()  # frees the lock, if this session had it
                    conn = None
                await asyncio.sleep(self.settings.retry_interval)
        except BaseException:  # cancelled, or no lease row: hold nothing
            if conn is not None:
                await conn.close()
            raise
        self._conn, self.epoch = conn, epoch
        self.lost.clear()
        self.valid_until = sent + self.settings.valid_for
        self._pinger = asyncio.create_task(self._ping(conn), name="dex-lease-ping")
        self._watchdog = asyncio.create_task(self._watch(), name="dex-lease-watchdog")
        log.info(
            "lease acquired",
            extra={"action": "lease.acquired", "epoch": epoch, "holder": self.holder},
        )
        return epoch

    async def release(self) -> None:
        """Free the lock at once (a planned step-down); the next node wins without waiting."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        self.valid_until = 0.0
        pinger, self._pinger = self._pinger, None
        if pinger is not None:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
        conn, self._conn = self._conn, None
        if conn is None:
            return  # never held (a standby stopping), or released already
        with contextlib.suppress(psycopg.Error):
            await conn.execute("SELECT pg_advisory_unlock(%s)", (LEADER_KEY,))
        await conn.close()  # ending the session frees the lock in any case
        log.info("lease released", extra={"action": "lease.released", "epoch": self.epoch})

    async def _connect(self) -> Conn:
        s = self.settings
        timeout_ms = int(s.session_timeout * 1000)
        conn = await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            application_name=f"dex-lease {self.holder}",
            connect_timeout=max(2, int(s.session_timeout)),
            keepalives=1,
            keepalives_idle=1,
            keepalives_interval=1,
            keepalives_count=max(1, int(s.session_timeout) - 1),
            tcp_user_timeout=timeout_ms,
        )
        # The server's side of the same promise: end this session (and free the lock)
        # soon after the node stops answering, whatever the server's defaults are.
        for setting, value in (
            ("idle_session_timeout", timeout_ms),
            ("idle_in_transaction_session_timeout", timeout_ms),
            ("tcp_user_timeout", timeout_ms),
            ("tcp_keepalives_idle", 1),
            ("tcp_keepalives_interval", 1),
            ("tcp_keepalives_count", max(1, int(s.session_timeout) - 1)),
            ("client_connection_check_interval", 1000),
        ):
            await conn.execute("SELECT set_config(%s, %s, false)", (setting, str(value)))
        return conn

    async def _bump(self, conn: Conn) -> int:
        async with conn.transaction():
            # Waits for write batches in flight (they hold it shared), then fences them.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (FENCE_KEY,))
            cur = await conn.execute(BUMP, (self.holder,))
            row = await cur.fetchone()
        if row is None:
            raise StorageError("no lease row: open the PostgreSQL store first (migrations)")
        return int(row[0])

    async def _read_clock(self, conn: Conn) -> None:
        """One round trip: the database's clock, to correct the node's (``clock``)."""
        sent = time.time()
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        row = await cur.fetchone()
        if self.clock is not None and row is not None:
            self.clock.observe(float(row[0]), sent, time.time())

    async def _ping(self, conn: Conn) -> None:
        s = self.settings
        while True:
            await asyncio.sleep(s.ping_interval)
            sent = time.monotonic()
            try:
                async with asyncio.timeout(s.ping_timeout):
                    await self._read_clock(conn)  # the ping reads the database's clock
            except (psycopg.Error, TimeoutError) as e:
                self.lose(f"the lock connection failed a ping: {e!r}")
                with contextlib.suppress(psycopg.Error, TimeoutError):
                    async with asyncio.timeout(s.ping_timeout):
                        await conn.close()
                return
            self.valid_until = sent + s.valid_for

    async def _watch(self) -> None:
        """Lose the lease as soon as ``valid_until`` passes without a ping coming back. A
        ping to a database that went silent (a partition) may take far longer than its
        timeout to give up (the driver's cancel request hangs too); the node must not wait
        for it."""
        while not self.lost.is_set():
            await asyncio.sleep(0.1)
            if time.monotonic() > self.valid_until:
                self.lose(f"no ping came back within {self.settings.valid_for:g}s")

    def lose(self, reason: str) -> None:
        """Take the lease as lost (a ping failed, or the store was fenced or lost a
        commit): ``valid()`` turns False and ``lost`` is set at once. The lock connection
        is left to the process's exit."""
        self.valid_until = 0.0
        if not self.lost.is_set():
            self.lost.set()
            log.error(
                "lease lost: %s",
                reason,
                extra={"action": "lease.lost", "epoch": self.epoch, "holder": self.holder},
            )
