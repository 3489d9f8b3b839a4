"""Hands queued Steps to connected Workers and watches the attempts they hold.

All of this is a cache of what storage says: the ready queues and the retry
timers are rebuilt from the sessions on start. What is durable is the attempt
record, written before any Worker hears of it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dex import _failpoints as failpoints

log = logging.getLogger("dex.dispatch")

Send = Callable[[dict[str, Any]], None]


@dataclass(eq=False)
class WorkerConn:
    id: str
    queues: set[str]
    capacity: int
    send: Send
    reserved: int = 0
    attempts: set[str] = field(default_factory=set)
    draining: bool = False

    @property
    def free(self) -> int:
        if self.draining:
            return 0
        return self.capacity - len(self.attempts) - self.reserved


@dataclass
class Held:
    """An attempt that a Worker holds."""

    session_id: str
    step_id: str
    number: int
    worker_id: str
    deadline: float
    output: int = 0
    """Characters of model output that reached the server."""


# Called to record a hand-out durably; returns the message to send, or None if the
# Step is no longer queued.
Assign = Callable[[str, str, WorkerConn], Awaitable[dict[str, Any] | None]]
Expire = Callable[[Held], Awaitable[None]]
Fire = Callable[[str, str], Awaitable[None]]


class Dispatcher:
    def __init__(self, heartbeat_timeout: float) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self.workers: dict[str, WorkerConn] = {}
        self.held: dict[str, Held] = {}
        self._ready: dict[str, deque[tuple[str, str]]] = {}
        self._delayed: list[tuple[float, int, str, str, str]] = []
        self._timers: list[tuple[float, int, str, str]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._assign: Assign | None = None
        self._expire: Expire | None = None
        self._fire: Fire | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    def start(self, assign: Assign, expire: Expire, fire: Fire) -> None:
        self._assign = assign
        self._expire = expire
        self._fire = fire
        self._runner = asyncio.create_task(self._run(), name="dex-dispatcher")

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- Workers -------------------------------------------------------------------

    def connect(self, worker: WorkerConn) -> None:
        old = self.workers.get(worker.id)
        if old is not None:
            worker.attempts = old.attempts
        self.workers[worker.id] = worker
        self._wake.set()

    def disconnect(self, worker: WorkerConn) -> None:
        """The attempts it holds stay held: they fail when their heartbeats stop."""
        if self.workers.get(worker.id) is worker:
            worker.draining = True
            del self.workers[worker.id]

    # --- Steps ------------------------------------------------------------------------

    def reserve(self, queue: str) -> WorkerConn | None:
        """Take one credit of a Worker that serves ``queue``, if any is free right now."""
        if self._ready.get(queue):
            return None  # keep queue order: earlier Steps go first
        best: WorkerConn | None = None
        for worker in self.workers.values():
            if (
                queue in worker.queues
                and worker.free > 0
                and (best is None or worker.free > best.free)
            ):
                best = worker
        if best is not None:
            best.reserved += 1
        return best

    def release(self, worker: WorkerConn) -> None:
        worker.reserved -= 1
        self._wake.set()

    def offer(self, session_id: str, step_id: str, queue: str, not_before: float | None) -> None:
        """A Step is queued: hand it out when a Worker is free and its backoff is over."""
        if not_before is not None and not_before > time.time():
            heapq.heappush(self._delayed, (not_before, next(self._seq), session_id, step_id, queue))
        else:
            self._ready.setdefault(queue, deque()).append((session_id, step_id))
        self._wake.set()

    def arm_timer(self, session_id: str, step_id: str, due: float) -> None:
        """Fire an AwaitTimer at ``due`` (wall clock); at once if it came due meanwhile."""
        heapq.heappush(self._timers, (due, next(self._seq), session_id, step_id))
        self._wake.set()

    def hold(self, worker: WorkerConn, attempt_id: str, held: Held) -> None:
        worker.reserved -= 1
        worker.attempts.add(attempt_id)
        self.held[attempt_id] = held

    def unhold(self, attempt_id: str) -> Held | None:
        held = self.held.pop(attempt_id, None)
        if held is not None:
            worker = self.workers.get(held.worker_id)
            if worker is not None:
                worker.attempts.discard(attempt_id)
                self._wake.set()
        return held

    def heartbeat(self, attempt_id: str) -> bool:
        """Extend an attempt's deadline. False if the attempt is not running (any more)."""
        held = self.held.get(attempt_id)
        if held is None:
            return False
        held.deadline = time.monotonic() + self.heartbeat_timeout
        return True

    # --- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now_wall = time.time()
            while self._delayed and self._delayed[0][0] <= now_wall:
                _, _, sid, step_id, queue = heapq.heappop(self._delayed)
                self._ready.setdefault(queue, deque()).append((sid, step_id))
            self._fire_timers(now_wall)
            self._pump()
            self._expire_heartbeats()
            timeout = 0.25
            for heap in (self._delayed, self._timers):
                if heap:
                    timeout = min(timeout, max(0.0, heap[0][0] - time.time()))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    def _fire_timers(self, now: float) -> None:
        assert self._fire is not None
        while self._timers and self._timers[0][0] <= now:
            _, _, session_id, step_id = heapq.heappop(self._timers)
            self._spawn(self._fire(session_id, step_id))

    def _pump(self) -> None:
        assert self._assign is not None
        for worker in list(self.workers.values()):
            while worker.free > 0:
                queue = next((q for q in worker.queues if self._ready.get(q)), None)
                if queue is None:
                    break
                sid, step_id = self._ready[queue].popleft()
                worker.reserved += 1
                self._spawn(self._hand_out(sid, step_id, worker))

    async def _hand_out(self, session_id: str, step_id: str, worker: WorkerConn) -> None:
        assert self._assign is not None
        try:
            message = await self._assign(session_id, step_id, worker)
        except Exception:
            log.exception(
                "hand-out failed",
                extra={
                    "action": "dispatch.assign_failed",
                    "session_id": session_id,
                    "step_id": step_id,
                },
            )
            message = None
        if message is None:
            self.release(worker)
        else:
            failpoints.hit("server.after_record_handout")
            worker.send(message)

    def _expire_heartbeats(self) -> None:
        assert self._expire is not None
        now = time.monotonic()
        for attempt_id, held in list(self.held.items()):
            if held.deadline <= now:
                self.unhold(attempt_id)
                self._spawn(self._expire(held))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
