"""The Worker's history cache gives the same items as validating everything, and reuses
the validated prefix."""

from __future__ import annotations

from typing import Any

from dex.wire import ITEMS
from dex.worker.history import HistoryCache

TURN_1: list[Any] = [
    {"type": "user", "text": "hi"},
    {"type": "assistant", "text": "", "tool_calls": [{"id": "c0", "name": "t", "arguments": {}}]},
    {"type": "tool_result", "call_id": "c0", "name": "t", "status": "succeeded", "result": 1},
]


def test_items_equal_a_full_validation_and_the_prefix_is_reused() -> None:
    cache = HistoryCache()
    first = cache.items("s1", TURN_1[:1])
    assert first == ITEMS.validate_python(TURN_1[:1])
    longer = cache.items("s1", TURN_1)
    assert longer == ITEMS.validate_python(TURN_1)
    assert longer[0] is first[0]  # validated once, reused


def test_a_changed_prefix_is_validated_again() -> None:
    cache = HistoryCache()
    cache.items("s1", TURN_1)
    compacted: list[Any] = [{"type": "summary", "text": "earlier"}, *TURN_1[1:]]
    assert cache.items("s1", compacted) == ITEMS.validate_python(compacted)


def test_sessions_are_kept_apart_and_bounded() -> None:
    cache = HistoryCache(sessions=2)
    for sid in ("a", "b", "c"):
        cache.items(sid, TURN_1[:1])
    assert list(cache._entries) == ["b", "c"]
    assert cache.items("a", TURN_1) == ITEMS.validate_python(TURN_1)
