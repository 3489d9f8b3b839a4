"""Bounded caches kept least recently used first (an ``OrderedDict`` whose end is the most
recent), bounded both by how many entries they hold and by how large those are."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def evict(
    entries: OrderedDict[K, V],
    count: int,
    size: int,
    size_of: Callable[[V], int],
    keep: Callable[[K, V], bool],
) -> int:
    """Forget the least recently used ``entries`` that ``keep`` does not hold, until
    ``count`` of them are gone and ``size`` of their ``size_of`` is freed, or none is left
    to forget; answers the size freed. Each entry kept on the way is made the most recent:
    it is passed over once, not at every call."""
    freed = 0
    if count <= 0 and size <= 0:
        return freed
    forgotten: list[K] = []
    kept: list[K] = []
    for key, value in entries.items():  # oldest first; stops at enough
        if count <= 0 and size <= 0:
            break
        if keep(key, value):
            kept.append(key)
        else:
            forgotten.append(key)
            count -= 1
            size -= size_of(value)
    for key in forgotten:
        freed += size_of(entries.pop(key))
    for key in kept:
        entries.move_to_end(key)
    return freed
