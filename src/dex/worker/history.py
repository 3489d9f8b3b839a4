"""Validated history, kept between a session's hand-outs.

A RunModel hand-out carries only the items of the model's view that this connection
was not sent before (``history_base`` says how many it builds on), so a turn costs the
same in a long conversation as in a short one. The Worker keeps each session's view as
it was last handed out, least recently used sessions dropped first; the server keeps
the same bound (the Worker's ``hello`` tells it), so it knows what the Worker has.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from dex.wire import ITEMS, Item


class HistoryCache:
    def __init__(self, sessions: int = 1024) -> None:
        self.sessions = sessions
        self._views: OrderedDict[str, list[Item]] = OrderedDict()

    def view(self, session_id: str, base: int, raw: bytes | msgspec.Raw) -> list[Item] | None:
        """The model's view for this hand-out: the first ``base`` items of the view last
        handed out, then the items of ``raw`` (the JSON the step carries, validated here:
        only the new items are). None if this Worker does not hold those ``base`` items
        (it dropped the session, or reconnected)."""
        if base:
            kept = self._views.get(session_id)
            if kept is None or len(kept) < base:
                return None
            # the common case keeps the whole view: one copy, not a slice and a copy
            head = kept if len(kept) == base else kept[:base]
            items = head + ITEMS.validate_json(bytes(raw))
        else:
            items = ITEMS.validate_json(bytes(raw))
        self._views[session_id] = items
        self._views.move_to_end(session_id)
        while len(self._views) > self.sessions:
            self._views.popitem(last=False)
        return items

    def forget(self, session_id: str) -> None:
        self._views.pop(session_id, None)
