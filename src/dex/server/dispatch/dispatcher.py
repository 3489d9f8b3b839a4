"""Hands queued Steps to connected Workers and watches the attempts they hold.

All of this is a cache of what storage says: the ready queues and the retry
timers are rebuilt from the sessions on start. What is durable is the attempt
record, written before any Worker hears of it.

An attempt is bound to the connection it was handed out on (``Held.conn``): only
that connection may heartbeat it, stream its output or settle it. When a
connection closes, its attempts wait ``reconnect_grace`` seconds for the same
Worker process to reconnect and re-claim them (it proves it is the same process
with the ``resume`` token of its last welcome); then they fail. An attempt whose
heartbeats stop for ``heartbeat_timeout`` fails too (a Worker alive but silent).

Both deadlines live in one heap, checked lazily: a heartbeat only moves a number. The
deadlines of attempts that ended are dropped in batches (``_drop_ended``), so the heap
holds about the attempts that run, not every attempt of the last ``heartbeat_timeout``.

The token outlives the node: each attempt's record keeps a digest of it (its
``proof``). A node that starts, or takes a partition over, finds attempts that storage
calls running; their Worker may still run them. Each waits ``reclaim_window`` seconds
(``await_reclaim``) for a Worker process that proves, with the token, that it is the
one it was handed to and names it in its hello; it then runs on as if nothing
happened. One not reclaimed in time fails, as a restart failed it before.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from dex import _failpoints as failpoints
from dex.errors import DexError
from dex.server.clock import Clock
from dex.server.dispatch.limits import Ask, Limits
from dex.server.dispatch.queues import FairQueue, Queued
from dex.server.supervisor import Supervisor
from dex.wire.protocol import CLOSE_ID_IN_USE
from dex.wire.server_frames import ServerMessage, Step

log = logging.getLogger("dex.dispatch")

Send = Callable[[ServerMessage], None]
"""Queue a message to a Worker connection (its outbox sends it in the next frame)."""
HAND_OUT_RETRY = 0.25
"""Seconds before a Step whose hand-out could not be recorded is offered again."""


DEADLINES_SLACK = 64
"""Deadlines of ended attempts the heap may keep beyond twice the running ones."""


BACK_OFF = 0.25
"""Seconds a Worker that handed a Step back, full, gets nothing more (``back_off``)."""


class WorkerIdInUse(Exception):
    """A live connection already uses this Worker id, and the hello did not prove it is
    the same Worker process (no valid ``resume`` token)."""


@dataclass(eq=False)
class WorkerConn:
    """One connection of a Worker."""

    id: str
    queues: set[str]
    capacity: int
    send: Send
    close: Callable[[int, str], None] = lambda code, reason: None
    """Close the connection from the server's side, with a close code and reason."""
    agents: list[str] = field(default_factory=list)
    reserved: int = 0
    attempts: set[str] = field(default_factory=set)
    draining: bool = False
    closed: bool = False
    resume: str = ""
    proof: str = ""
    """The digest of ``resume`` that its attempts' records keep (``proof_of``)."""
    connected_at: float = field(default_factory=time.time)
    history_cache: int = 0
    """How many sessions' history the Worker keeps (its hello says)."""
    history_sent: OrderedDict[str, tuple[tuple[int, int | None], int, int]] = field(
        default_factory=OrderedDict
    )
    """Per session, what the last RunModel hand-out on this connection carried: the
    context's shape (context_start, summary_at), how many history items it covered, and
    how long the model's view was. The next hand-out sends only what came after."""

    limit: int | None = None
    """What the Worker may take now at most, when less than ``capacity``: it handed a Step
    back because it was full (its capacity is shared by its connections to every node of
    a cluster), so this node sends it nothing more until one of its attempts here ends or
    ``BACK_OFF`` passes (``Dispatcher.back_off``)."""

    @property
    def free(self) -> int:
        if self.draining or self.closed:
            return 0
        capacity = self.capacity if self.limit is None else self.limit
        return capacity - len(self.attempts) - self.reserved


@dataclass(eq=False)
class Held:
    """An attempt that a Worker holds."""

    session_id: str
    step_id: str
    number: int
    conn: WorkerConn
    deadline: float
    """Monotonic time by which the next heartbeat must arrive."""
    output: int = 0
    """Characters of model output that reached the server."""
    grace_until: float | None = None
    """Set while its connection is closed: monotonic time by which the Worker must have
    reconnected and re-claimed it."""
    expiring: bool = False
    """Its deadline passed and its failure is being recorded: it stays held (storage
    still calls it running) but its Worker may not settle or extend it any more."""
    refused: str = ""
    """Why its Worker's result was refused, once it was: the Worker forgot it (``let_go``)."""
    proof: str | None = None
    """Set while it waits to be reclaimed after a restart or takeover
    (``Dispatcher.await_reclaim``): only a hello whose resume token has this digest
    reclaims it."""

    @property
    def worker_id(self) -> str:
        return self.conn.id

    @property
    def due(self) -> float:
        if self.grace_until is not None:
            return min(self.deadline, self.grace_until)
        return self.deadline


# Called to record a hand-out durably; returns the message to send, or None if the
# Step is no longer queued.
Assign = Callable[[str, str, WorkerConn], Awaitable[Step | None]]
Expire = Callable[[Held], Coroutine[Any, Any, None]]
Fire = Callable[[str, str], Coroutine[Any, Any, None]]


def _every_session(session_id: str) -> bool:
    return True


def _nowhere(message: ServerMessage) -> None:
    """The send of a connection that is gone."""


def proof_of(resume: str) -> str:
    """What an attempt's record keeps of its connection's resume token: a digest, so that
    the token itself, which settles attempts, is in no row."""
    return hashlib.blake2b(resume.encode(), digest_size=12).hexdigest()


class Dispatcher:
    def __init__(
        self,
        heartbeat_timeout: float,
        reconnect_grace: float = 1.0,
        clock: Clock | None = None,
        reclaim_window: float = 0.0,
    ) -> None:
        self.clock = clock or Clock()
        """Durable deadlines (timers, retry backoffs) are on this clock: the database's."""
        self.heartbeat_timeout = heartbeat_timeout
        self.reconnect_grace = reconnect_grace
        self.reclaim_window = reclaim_window
        """Seconds an attempt left running by a restart or takeover waits for its Worker to
        reclaim it (``await_reclaim``); 0: it fails at once."""
        self.reclaimed = 0
        """Attempts a Worker reclaimed after a restart or takeover."""
        self.workers: dict[str, WorkerConn] = {}
        """Live connections by Worker id."""
        self.held: dict[str, Held] = {}
        self.handing: dict[str, int] = {}
        """Per session, hand-outs that took a Worker's credit and are not held yet: their
        commit is in flight. Once it is durable the attempt is held (or the credit goes
        back): a hand-over or a drain waits for these as for the attempts held."""
        self.refused = 0
        """Messages about an attempt that the sending connection does not hold."""
        self.bytes_sent = 0
        """Bytes of frames sent to Workers: over hand-outs, what a hand-out costs."""
        self._resume: dict[str, str] = {}
        """The resume token of each Worker id that is connected or holds attempts."""
        self.limits = Limits(self.clock.now)
        """The model limits and tool concurrency keys a Step's hand-out must pass."""
        self.weights: dict[str, float] = {}
        """Each tenant's weight in the queues' fair shares (1 when not named)."""
        self._ready: dict[str, FairQueue] = {}
        self._delayed: list[tuple[float, int, Queued]] = []
        self._timers: list[tuple[float, int, str, str]] = []
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._ready_count = 0
        """Steps in the ready queues: a freed credit wakes the loop only when one waits."""
        self._waiter: asyncio.Future[None] | None = None
        """What the loop sleeps on until the next deadline or a ``_wake``."""
        self._assign: Assign | None = None
        self._expire: Expire | None = None
        self._fire: Fire | None = None
        self.supervisor = Supervisor()
        """The node's background work: this loop's, the Worker channel's and the domain's."""
        self._runner: asyncio.Task[None] | None = None
        self.paused = False
        """Draining: hand nothing out and fire no timer (both stay queued in storage)."""
        self.dispatches: Callable[[str], bool] = _every_session
        """Whether this node hands out a session's Steps and fires its timers: in a
        cluster, only its own partitions' (a Step of another's is dropped here: the node
        that takes the partition queues it again from storage)."""
        self._none_held = asyncio.Event()
        """Set while no attempt is held or being handed out."""
        self._none_held.set()

    def start(self, assign: Assign, expire: Expire, fire: Fire) -> None:
        self._assign = assign
        self._expire = expire
        self._fire = fire
        self._runner = asyncio.create_task(self._run(), name="dex-dispatcher")

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        await self.supervisor.stop()

    # --- Workers -------------------------------------------------------------------

    def connect(
        self, conn: WorkerConn, claimed: list[str], resume: str | None
    ) -> tuple[list[str], list[Held]]:
        """Register a connection. With a valid ``resume`` token it is the same Worker
        process reconnecting: the attempts it names in ``claimed`` are bound to it, and
        those it does not name were never received. Returns (the claimed attempts it
        does not hold any more: to stop, the unnamed ones: to hand back)."""
        proven = resume is not None and self._resume.get(conn.id) == resume
        old = self.workers.get(conn.id)
        if old is not None and not proven:
            raise WorkerIdInUse(conn.id)
        if old is not None:
            self.disconnect(old)
            old.close(CLOSE_ID_IN_USE, "superseded by a newer connection of this Worker")
        proof = proof_of(resume) if resume else None
        reclaims = proof is not None and any(
            h.proof == proof and h.conn.id == conn.id for h in self.held.values()
        )
        conn.resume = resume if resume and (proven or reclaims) else secrets.token_urlsafe(16)
        conn.proof = proof_of(conn.resume)
        self._resume[conn.id] = conn.resume
        self.workers[conn.id] = conn
        stop, unnamed = [], []
        if proven or reclaims:
            wanted = set(claimed)
            now = time.monotonic()
            for attempt_id, held in self.held.items():
                if held.conn.id != conn.id or held.conn is conn or held.expiring:
                    continue
                if held.proof is not None and held.proof != proof:
                    continue  # left by a restart: another process of this id holds it
                if held.proof is None and not proven:
                    continue
                if attempt_id in wanted:
                    self._bind(held, attempt_id, conn, now)
                elif held.proof is not None or held.refused:
                    # not named, and its result was refused; or left running by a restart
                    # and not named: the process never received it, or let go of it (its
                    # result refused by the node that died, say). A body that ran must not
                    # run again, so it fails now rather than go back
                    held.grace_until = now
                    heapq.heappush(self._deadlines, (now, next(self._seq), attempt_id))
                else:  # never received: it goes back, so it must not expire meanwhile
                    held.expiring = True
                    unnamed.append(held)
        stop = [a for a in claimed if a not in conn.attempts]
        self._wake()
        return stop, unnamed

    def claim(self, conn: WorkerConn, attempt_id: str, resume: str) -> bool | None:
        """In a cluster: ``conn``'s Worker claims an attempt it was handed on its connection
        to another node, now gone, whose partition this node took over (the attempt waits
        to be reclaimed: ``await_reclaim``). True: it is ``conn``'s (now, or already);
        False: it runs nowhere for this Worker (not held here, failing, another's, or the
        token, ``resume``, is not the one it was handed out under); None: not decided yet
        (it is held here by a connection of this Worker that dropped and may come back)."""
        held = self.held.get(attempt_id)
        if held is None or held.expiring or held.conn.id != conn.id:
            return False
        if held.conn is conn:
            return True
        if held.proof is None:
            return None if held.conn.closed else False
        if held.proof != proof_of(resume):
            return False
        self._bind(held, attempt_id, conn, time.monotonic())
        self._wake()
        return True

    def _bind(self, held: Held, attempt_id: str, conn: WorkerConn, now: float) -> None:
        """The attempt is ``conn``'s from now on: a Worker that reconnected, or reclaimed
        it after a restart or takeover, named it."""
        held.conn.attempts.discard(attempt_id)
        held.conn = conn
        held.grace_until = None
        held.deadline = now + self.heartbeat_timeout
        conn.attempts.add(attempt_id)
        if held.proof is not None:
            held.proof = None
            self.reclaimed += 1

    def disconnect(self, conn: WorkerConn) -> None:
        """The connection closed: its attempts wait ``reconnect_grace`` for the Worker."""
        if conn.closed:
            return
        conn.closed = True
        if self.workers.get(conn.id) is conn:
            del self.workers[conn.id]
        until = time.monotonic() + self.reconnect_grace
        for attempt_id in conn.attempts:
            held = self.held.get(attempt_id)
            if held is not None:
                held.grace_until = until
                heapq.heappush(self._deadlines, (until, next(self._seq), attempt_id))
        self._forget_resume(conn.id)
        self._wake()

    def _forget_resume(self, worker_id: str) -> None:
        if worker_id not in self.workers and not any(
            h.conn.id == worker_id for h in self.held.values()
        ):
            self._resume.pop(worker_id, None)

    def owned(self, conn: WorkerConn, attempt_id: str) -> Held | None:
        """The attempt, if this connection holds it."""
        held = self.held.get(attempt_id)
        if held is None or held.conn is not conn or held.expiring:
            return None
        return held

    def refuse(self, conn: WorkerConn, attempt_id: str, what: str) -> str:
        """Count and log a message about an attempt this connection does not hold."""
        self.refused += 1
        held = self.held.get(attempt_id)
        reason = (
            f"attempt {attempt_id} is not held by this connection"
            if held is not None
            else f"attempt {attempt_id} is not running"
        )
        if held is not None:
            log.warning(
                "refused a message about another connection's attempt",
                extra={
                    "action": "worker.message_refused",
                    "worker_id": conn.id,
                    "attempt_id": attempt_id,
                    "kind": what,
                    "holder": held.worker_id,
                },
            )
        return reason

    # --- Steps ------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop handing out Steps and firing timers (a drain): what is queued stays queued
        in storage for the next node."""
        self.paused = True

    async def wait_none_held(self, timeout: float) -> bool:
        """Wait until no attempt is held or being handed out, up to ``timeout``; whether
        none is."""
        try:
            await asyncio.wait_for(self._none_held.wait(), timeout)
        except TimeoutError:
            return not self.held and not self.handing
        return True

    def busy(self, which: Callable[[str], bool]) -> bool:
        """Whether an attempt of the sessions ``which`` takes is held, or being handed out
        (recorded in a commit not yet durable: it is held once it is)."""
        return any(which(h.session_id) for h in self.held.values()) or any(
            which(session_id) for session_id in self.handing
        )

    def close_all(self, code: int, reason: str) -> None:
        """Close every Worker connection from the server's side."""
        for conn in list(self.workers.values()):
            conn.close(code, reason)

    def reserve(
        self, queue: str, session_id: str, step_id: str, ask: Ask | None = None
    ) -> WorkerConn | None:
        """Take one credit of a Worker that serves ``queue``, if any is free right now and
        the limits admit what the Step asks (``ask``), for a Step of ``session_id``:
        ``hold`` (its hand-out recorded) or ``release`` (not) gives it back."""
        if self.paused or self._ready.get(queue):
            return None  # keep queue order: earlier Steps go first
        best: WorkerConn | None = None
        most = 0
        for worker in self.workers.values():
            if queue in worker.queues:
                free = worker.free
                if free > most:
                    best, most = worker, free
        if best is None or (ask is not None and self.limits.admit(session_id, step_id, ask)):
            return None  # one a limit holds is offered, and waits at its gate
        self._reserve(best, session_id)
        return best

    def _reserve(self, worker: WorkerConn, session_id: str) -> None:
        worker.reserved += 1
        self.handing[session_id] = self.handing.get(session_id, 0) + 1
        self._none_held.clear()

    def _reserved(self, worker: WorkerConn, session_id: str) -> None:
        """The credit ``reserve`` took for a Step of ``session_id`` is used or given back."""
        worker.reserved -= 1
        left = self.handing.pop(session_id, 0) - 1
        if left > 0:
            self.handing[session_id] = left
        elif not self.held and not self.handing:
            self._none_held.set()

    def release(
        self, worker: WorkerConn, session_id: str, step_id: str, admitted: bool = True
    ) -> None:
        """The hand-out of a Step was not recorded: the credit goes back, and what the
        limits ``admitted`` for it."""
        self._reserved(worker, session_id)
        if admitted:
            self.limits.release(session_id, step_id)
        if self._ready_count:
            self._wake()

    def offer(self, step: Queued, not_before: float | None = None) -> None:
        """A Step is queued: hand it out when a Worker is free, its backoff is over, the
        limits admit what it asks (``step.ask``), and its tenant's turn comes."""
        if not_before is not None and not_before > self.clock.now():
            heapq.heappush(self._delayed, (not_before, next(self._seq), step))
        else:
            self._ready_for(step.queue).push(step)
            self._ready_count += 1
        self._wake()

    def _ready_for(self, queue: str) -> FairQueue:
        ready = self._ready.get(queue)
        if ready is None:
            ready = self._ready[queue] = FairQueue(lambda tenant: self.weights.get(tenant, 1.0))
        return ready

    def queued(self) -> dict[str, int]:
        """How many Steps wait in each queue (ready, in backoff, or held by a limit)."""
        counts = {queue: len(steps) for queue, steps in self._ready.items() if steps}
        for _, _, step in self._delayed:
            counts[step.queue] = counts.get(step.queue, 0) + 1
        for step in self.limits.parked():
            counts[step.queue] = counts.get(step.queue, 0) + 1
        return counts

    def arm_timer(self, session_id: str, step_id: str, due: float) -> None:
        """Fire an AwaitTimer at ``due`` (wall clock); at once if it came due meanwhile."""
        heapq.heappush(self._timers, (due, next(self._seq), session_id, step_id))
        self._wake()

    def hold(self, worker: WorkerConn, attempt_id: str, held: Held) -> None:
        """The hand-out ``reserve`` took ``worker``'s credit for is recorded: it holds it."""
        worker.attempts.add(attempt_id)
        self.held[attempt_id] = held
        self._reserved(worker, held.session_id)
        self._none_held.clear()
        if worker.closed:  # it dropped while the hand-out was being recorded
            held.grace_until = time.monotonic() + self.reconnect_grace
        heapq.heappush(self._deadlines, (held.due, next(self._seq), attempt_id))

    def let_go(self, conn: WorkerConn, attempt_id: str, why: str, *, fail: bool) -> None:
        """The connection's Worker forgot the attempt (its result was refused, ``why``, and
        it was told so): it is not a hand-out the Worker never received, which a reconnect
        that does not name it sends back to its queue, for its body ran. With ``fail``
        it fails now."""
        held = self.owned(conn, attempt_id)
        if held is None:
            return
        held.refused = why
        if fail:
            assert self._expire is not None
            held.expiring = True  # it stays held until its failure is committed
            self.supervisor.spawn(self._expire(held))

    def await_reclaim(
        self,
        attempt_id: str,
        *,
        session_id: str,
        step_id: str,
        number: int,
        worker_id: str,
        proof: str,
    ) -> None:
        """Hold an attempt that storage calls running after a restart or a takeover: for
        ``reclaim_window`` seconds its Worker may reconnect, prove with its resume token
        that it is the process the attempt was handed to, and reclaim it; else it fails
        (``expire``)."""
        absent = WorkerConn(id=worker_id, queues=set(), capacity=0, send=_nowhere, closed=True)
        now = time.monotonic()
        held = Held(
            session_id,
            step_id,
            number,
            absent,
            deadline=now + self.heartbeat_timeout,
            grace_until=now + self.reclaim_window,
            proof=proof,
        )
        absent.attempts.add(attempt_id)
        self.held[attempt_id] = held
        self._none_held.clear()
        heapq.heappush(self._deadlines, (held.due, next(self._seq), attempt_id))
        self._wake()

    def unhold(self, attempt_id: str, only: Held | None = None) -> Held | None:
        """Let go of an attempt (``only``: if it is still that very hold; a Step handed
        back may be out again under the same id)."""
        if only is not None and self.held.get(attempt_id) is not only:
            return None
        held = self.held.pop(attempt_id, None)
        if not self.held and not self.handing:
            self._none_held.set()
        if held is not None:
            self.limits.release(held.session_id, held.step_id)
            self._drop_ended()
            held.conn.attempts.discard(attempt_id)
            if held.conn.closed:
                self._forget_resume(held.conn.id)
            if self._ready_count:
                self._wake()
        return held

    def _drop_ended(self) -> None:
        """Rebuild the deadline heap with one entry per attempt held, once ended attempts'
        entries are most of it: each hold and expiry then costs a heap of the running
        attempts, and the rebuild, linear, happens once per that many ends. An expiring
        attempt needs none (its failure is being recorded, and unholds it)."""
        if len(self._deadlines) > 2 * len(self.held) + DEADLINES_SLACK:
            self._deadlines = [
                (held.due, next(self._seq), attempt_id)
                for attempt_id, held in self.held.items()
                if not held.expiring
            ]
            heapq.heapify(self._deadlines)

    def back_off(self, worker: WorkerConn) -> None:
        """The Worker handed a Step back unstarted, being full: send it nothing beyond what
        it runs here now until one of those ends (``lift``) or ``BACK_OFF`` passes, so a
        full Worker is not handed the same Step over and over (two commits each)."""
        worker.limit = max(0, len(worker.attempts) - 1)  # the one handed back goes
        asyncio.get_running_loop().call_later(BACK_OFF, self.lift, worker)

    def lift(self, worker: WorkerConn) -> None:
        """Take the Worker at its full capacity again."""
        if worker.limit is not None:
            worker.limit = None
            self._wake()

    def heartbeat(self, conn: WorkerConn, attempt_id: str) -> bool:
        """Extend an attempt's deadline. False if this connection does not hold it."""
        held = self.owned(conn, attempt_id)
        if held is None:
            return False
        held.deadline = time.monotonic() + self.heartbeat_timeout
        return True

    # --- the loop ---------------------------------------------------------------------

    def _wake(self) -> None:
        """Have the loop look again now (new work, a freed credit, an earlier deadline)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._waiter = loop.create_future()
            now_wall = self.clock.now()
            while self._delayed and self._delayed[0][0] <= now_wall:
                _, _, step = heapq.heappop(self._delayed)
                self._ready_for(step.queue).push(step)
                self._ready_count += 1
            for step in self.limits.due():  # ahead of its tenant's Steps that came after it
                self._ready_for(step.queue).push(step, front=True)
                self._ready_count += 1
            self._fire_timers(now_wall)
            self._pump()
            self._expire_attempts()
            timeout = 0.25
            for heap in (self._delayed, self._timers):
                if heap:
                    timeout = min(timeout, max(0.0, heap[0][0] - self.clock.now()))
            wake = self.limits.next_wake()
            if wake is not None:
                timeout = min(timeout, max(0.0, wake - self.clock.now()))
            if self._deadlines:
                timeout = min(timeout, max(0.0, self._deadlines[0][0] - time.monotonic()))
            if not self._waiter.done():
                timer = loop.call_later(timeout, self._wake)
                await self._waiter
                timer.cancel()

    def _fire_timers(self, now: float) -> None:
        assert self._fire is not None
        while not self.paused and self._timers and self._timers[0][0] <= now:
            _, _, session_id, step_id = heapq.heappop(self._timers)
            if self.dispatches(session_id):
                self.supervisor.spawn(self._fire(session_id, step_id))

    def _pump(self) -> None:
        assert self._assign is not None
        if self.paused:
            return
        for worker in list(self.workers.values()):
            while worker.free > 0:
                queue = next((q for q in worker.queues if self._ready.get(q)), None)
                if queue is None:
                    break
                step = self._ready[queue].pop()
                self._ready_count -= 1
                if not self.dispatches(step.session_id):
                    self.limits.forget(step.session_id, step.step_id)
                    continue
                # a second offer of a Step that runs already (its hand-out will find it
                # not queued) asks nothing of the limits: its call counts once
                admitted = step.ask is not None and not self.limits.counts(
                    step.session_id, step.step_id
                )
                if admitted:
                    assert step.ask is not None
                    blocked = self.limits.admit(step.session_id, step.step_id, step.ask)
                    if blocked is not None:
                        self.limits.park(step, blocked)
                        continue
                self._reserve(worker, step.session_id)
                self.supervisor.spawn(self._hand_out(step, worker, admitted))

    async def _hand_out(self, step: Queued, worker: WorkerConn, admitted: bool) -> None:
        assert self._assign is not None
        session_id, step_id = step.session_id, step.step_id
        try:
            message = await self._assign(session_id, step_id, worker)
        except Exception as e:
            # not recorded (a full disk, a reloaded session): the Step is still queued in
            # storage, so it goes back in the queue here too, or it would wait for a restart
            log.warning(
                "hand-out failed, the Step is offered again in %gs: %r",
                HAND_OUT_RETRY,
                e,
                exc_info=not isinstance(e, DexError),
                extra={
                    "action": "dispatch.assign_failed",
                    "session_id": session_id,
                    "step_id": step_id,
                },
            )
            self.release(worker, session_id, step_id, admitted)
            self.offer(step, self.clock.now() + HAND_OUT_RETRY)
            return
        if message is None:
            self.release(worker, session_id, step_id, admitted)
        else:
            failpoints.hit("server.after_record_handout")
            worker.send(message)

    def _expire_attempts(self) -> None:
        """Fail the attempts whose heartbeat deadline or reconnect grace has passed."""
        assert self._expire is not None
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, attempt_id = heapq.heappop(self._deadlines)
            held = self.held.get(attempt_id)
            if held is None or held.expiring:
                continue
            if held.due > now:  # a heartbeat moved it: look again then
                heapq.heappush(self._deadlines, (held.due, next(self._seq), attempt_id))
                continue
            # it stays held until its failure is committed (the callee unholds it)
            held.expiring = True
            self.supervisor.spawn(self._expire(held))
