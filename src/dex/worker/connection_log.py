"""The lines a Worker logs about its life: connected, lost, reconnected, stopped. In a
cluster each connection (one per node) logs its own, with its node's address.

The TypeScript and Go Workers log the same lines, with the same actions, messages and
fields (``sdk/typescript/src/log.ts``, ``sdk/go/dex/log.go``; the table in docs/operations.md):

- ``worker.connected`` (info), the first welcome: ``address``, ``agents``, ``capacity``,
  ``worker_id``;
- ``worker.connect_failed``: a try that reached no node that serves. Only the first, before
  the Worker ever connected, at warning ("is the server up?"); the others at debug, so a
  server that restarts gives one line, not one per retry;
- ``worker.connection_lost`` (warning), once per outage: ``address``, ``error``; in a
  cluster, a node that no connected node lists any more is not reconnected to (the line
  says so);
- ``worker.node_left`` (info): ``address``, a cluster member whose connection was down and
  that no connected node lists any more: the Worker stops trying it;
- ``worker.reconnected`` (info): ``address``, ``tries`` (the tries it took, this one
  included), ``seconds`` (since the connection was lost), ``worker_id``;
- ``worker.stopped``: ``reason`` ``SIGTERM``, ``SIGINT`` or ``shutdown`` (info: drained),
  or ``error`` (error, with ``error``: the Worker gives up for good), and ``worker_id``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from dex._logging import field_text

log = logging.getLogger("dex.worker")


class ConnectionLog:
    """Decides which connection events are worth a line: one per change, not per retry."""

    def __init__(
        self,
        worker_id: str,
        agents: Sequence[str],
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.agents = list(agents)
        self.capacity = capacity
        self._clock = clock
        self._connected = False
        """Whether any node ever welcomed this Worker."""
        self._lost_at: float | None = None
        """When the last connection was lost, until the next welcome."""
        self._failed = 0
        """Tries that failed since the last welcome (or since the start)."""

    def connected(self, address: str) -> None:
        """A node welcomed this Worker."""
        if not self._connected:
            log.info(
                "connected to %s",
                address,
                extra={
                    "action": "worker.connected",
                    "address": address,
                    "agents": self.agents,
                    "capacity": self.capacity,
                    "worker_id": self.worker_id,
                },
            )
        else:
            tries = self._failed + 1
            lost_at = self._lost_at if self._lost_at is not None else self._clock()
            seconds = round(self._clock() - lost_at, 3)
            log.info(
                "reconnected to %s after %ss and %d %s",
                address,
                field_text(seconds),
                tries,
                "try" if tries == 1 else "tries",
                extra={
                    "action": "worker.reconnected",
                    "address": address,
                    "tries": tries,
                    "seconds": seconds,
                    "worker_id": self.worker_id,
                },
            )
        self._connected = True
        self._lost_at = None
        self._failed = 0

    def failed(self, address: str, error: object) -> None:
        """A try reached no node that serves (unreachable, or closed before its welcome)."""
        self._failed += 1
        first = not self._connected and self._failed == 1
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "cannot reach %s: %s%s",
            address,
            error,
            "; trying again until it answers" if first else "",
            extra={"action": "worker.connect_failed", "address": address, "error": str(error)},
        )

    def lost(self, address: str, error: object, *, reconnecting: bool = True) -> None:
        """A connection that had been welcomed ended, and the Worker goes on (without
        reconnecting to a node no connected node lists any more)."""
        self._lost_at = self._clock()
        self._failed = 0
        log.warning(
            "lost the connection to %s: %s; %s",
            address,
            error,
            "reconnecting" if reconnecting else "no node lists it any more, not reconnecting",
            extra={"action": "worker.connection_lost", "address": address, "error": str(error)},
        )

    def let_go(self, address: str) -> None:
        """A cluster member whose connection is down and that no node lists any more."""
        log.info(
            "no connected node lists %s any more: not reconnecting to it",
            address,
            extra={"action": "worker.node_left", "address": address},
        )

    def stopped(self, reason: str, error: object = None) -> None:
        """The Worker stops: drained after ``reason`` (a signal's name, or ``shutdown``), or
        given up on ``error``."""
        if error is not None:
            log.error(
                "stopped: %s",
                error,
                extra={
                    "action": "worker.stopped",
                    "reason": "error",
                    "error": str(error),
                    "worker_id": self.worker_id,
                },
            )
        else:
            log.info(
                "stopped: %s, drained",
                reason,
                extra={"action": "worker.stopped", "reason": reason, "worker_id": self.worker_id},
            )
