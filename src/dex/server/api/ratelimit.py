"""Rate limits on the client API, per token (``limits``: fixed windows, in memory).

``--rate-limit "20/second; 600/minute"`` (``DEX_RATE_LIMIT``) is every token's limit
unless its tokens-file entry sets ``rate_limit``; with auth off the limit is kept per
client address. A request over a limit is answered 429 with ``Retry-After`` (seconds)
and a JSON error; it changes nothing. The counts live in the node's memory: a restart
or a takeover starts them again.
"""

from __future__ import annotations

import functools
import math
import time

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter


class RateLimits:
    def __init__(self, default: str | None) -> None:
        self.default = default
        self._limiter = FixedWindowRateLimiter(MemoryStorage())
        self.refused = 0

    def enabled_for(self, limit: str | None) -> bool:
        return (limit or self.default) is not None

    def check(self, key: str, limit: str | None) -> tuple[str, int] | None:
        """Count one request of ``key`` against ``limit`` (or the default). None when it
        may go on; else the limit it is over and the seconds until it may try again."""
        text = limit or self.default
        if text is None:
            return None
        items = _parse(text)
        if len(items) == 1:  # the usual case: one call, counted only if under the limit
            (item,) = items
            if self._limiter.hit(item, key):
                return None
            return self._over(item, key)
        for item in items:
            if not self._limiter.test(item, key):  # a refused request counts against none
                return self._over(item, key)
        for item in items:
            self._limiter.hit(item, key)
        return None

    def _over(self, item: RateLimitItem, key: str) -> tuple[str, int]:
        reset = self._limiter.get_window_stats(item, key).reset_time
        self.refused += 1
        return str(item), max(1, math.ceil(reset - time.time()))


@functools.cache
def _parse(text: str) -> list[RateLimitItem]:
    return parse_many(text)
