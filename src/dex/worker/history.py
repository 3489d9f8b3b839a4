"""Validated history, reused across a session's hand-outs.

Each RunModel hand-out carries the session's history, and a session's consecutive
hand-outs share all but their last few items. Validating only the items that changed
halves a Worker's CPU per turn.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from dex.wire import ITEMS, Item


class HistoryCache:
    def __init__(self, sessions: int = 1024) -> None:
        self.sessions = sessions
        self._entries: OrderedDict[str, tuple[list[Any], list[Item]]] = OrderedDict()

    def items(self, session_id: str, raw: list[Any]) -> list[Item]:
        """``raw`` (JSON) as history items; the prefix seen last time is not validated again."""
        same = 0
        cached = self._entries.get(session_id)
        if cached is not None:
            old_raw, old_items = cached
            limit = min(len(old_raw), len(raw))
            while same < limit and old_raw[same] == raw[same]:
                same += 1
            items = old_items[:same] + ITEMS.validate_python(raw[same:])
        else:
            items = ITEMS.validate_python(raw)
        self._entries[session_id] = (raw, items)
        self._entries.move_to_end(session_id)
        while len(self._entries) > self.sessions:
            self._entries.popitem(last=False)
        return items
