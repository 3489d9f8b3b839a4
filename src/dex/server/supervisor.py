"""The node's background work: tasks nobody awaits (a hand-out, an expired attempt's
failure, a timer's firing, a recorded input's handler), run, kept, logged when they fail,
and cancelled together when the node stops. One supervisor serves the dispatcher and the
domain alike: ``Dispatcher.supervisor``.

``retrying`` runs work that must commit until it does: a storage error never drops a
timer, a recorded input or an attempt's failure; each failed try is logged and counted
(``failures``: the metric ``dex_background_retries``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dex.errors import Conflict, DexError, NotFound

log = logging.getLogger("dex.supervisor")


class Supervisor:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()
        self.failures = 0
        """Tries of background work that failed and were tried again (``retrying``)."""

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` in the background; a failure is logged (each callee handles its own)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "background work failed",
                exc_info=task.exception(),
                extra={"action": "background.task_failed"},
            )

    async def retrying(self, what: str, op: Callable[[], Awaitable[Any]], **ids: Any) -> None:
        """Run ``op`` until it commits. ``Conflict`` and ``NotFound`` mean the state moved on
        without it: nothing to do."""
        delay = 0.05
        while True:
            try:
                await op()
                return
            except (Conflict, NotFound):
                return
            except Exception as e:
                self.failures += 1
                log.warning(
                    "%s failed, trying again in %.2fs: %r",
                    what,
                    delay,
                    e,
                    exc_info=not isinstance(e, DexError),
                    extra={"action": "sessions.retry", "what": what, **ids},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def stop(self) -> None:
        """Cancel every task still running, and wait until they end."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
