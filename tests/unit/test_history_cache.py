"""The Worker's history cache builds each hand-out's view from what it kept and what the
hand-out adds, validating only the new items, and says when it lacks the base."""

from __future__ import annotations

from typing import Any

import orjson

from dex.wire import ITEMS
from dex.worker.history import HistoryCache

TURN_1: list[Any] = [
    {"type": "user", "text": "hi"},
    {"type": "assistant", "text": "", "tool_calls": [{"id": "c0", "name": "t", "arguments": {}}]},
    {"type": "tool_result", "call_id": "c0", "name": "t", "status": "succeeded", "result": 1},
]


def test_a_view_built_on_a_base_equals_a_full_validation_and_reuses_the_base() -> None:
    cache = HistoryCache()
    first = cache.view("s1", 0, orjson.dumps(TURN_1[:1]))
    assert first == ITEMS.validate_python(TURN_1[:1])
    longer = cache.view("s1", 1, orjson.dumps(TURN_1[1:]))
    assert longer == ITEMS.validate_python(TURN_1)
    assert longer is not None and first is not None
    assert longer[0] is first[0]  # validated once, reused


def test_a_base_of_zero_replaces_the_view() -> None:
    cache = HistoryCache()
    cache.view("s1", 0, orjson.dumps(TURN_1))
    compacted: list[Any] = [{"type": "summary", "text": "earlier"}, *TURN_1[1:]]
    assert cache.view("s1", 0, orjson.dumps(compacted)) == ITEMS.validate_python(compacted)


def test_a_missing_base_is_reported_not_guessed() -> None:
    cache = HistoryCache(sessions=2)
    assert cache.view("s1", 2, orjson.dumps(TURN_1[2:])) is None  # never seen
    cache.view("s1", 0, orjson.dumps(TURN_1[:1]))
    assert cache.view("s1", 2, orjson.dumps(TURN_1[2:])) is None  # holds 1 item, not 2
    for sid in ("a", "b"):
        cache.view(sid, 0, orjson.dumps(TURN_1[:1]))
    assert cache.view("s1", 1, orjson.dumps(TURN_1[1:])) is None  # dropped: least recently used
    assert cache.view("b", 1, orjson.dumps(TURN_1[1:])) == ITEMS.validate_python(TURN_1)
