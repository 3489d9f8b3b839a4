"""The wall clock of durable deadlines: when a timer fires, when a retry may start, how
long a retry window lasts.

Nodes that share a database may disagree about the time; their deadlines must not. With
PostgreSQL, the lease reads the database's clock on every ping and the node's clock is
corrected to it (the offset, measured at the middle of the round trip); a node that
takes over fires a timer when the database's clock says it is due, whatever its own says.
The embedded node's offset stays 0.
"""

from __future__ import annotations

import time


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0
        """Seconds to add to this host's clock to get the database's."""

    def now(self) -> float:
        """Unix time, as the database tells it."""
        return time.time() + self.offset

    def observe(self, database_time: float, sent: float, received: float) -> None:
        """A reading of the database's clock taken between ``sent`` and ``received`` (this
        host's ``time.time()``)."""
        self.offset = database_time - (sent + received) / 2
