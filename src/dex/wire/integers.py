"""JSON on the Worker WebSocket carries integers from -2**63 to 2**64-1 only: Python reads
and writes larger ones, but the other side may not (JavaScript, Go), and a value that can
be neither stored nor sent on silences whoever it is sent to."""

from __future__ import annotations

from typing import Any

import msgspec

_DIGITS_ONLY = bytes(ord("0") if chr(b) in "0123456789" else ord(" ") for b in range(256))
"""A table for ``bytes.translate`` that maps each digit to ``0`` and every other byte to
a space: a run of 19 digits becomes 19 zeros, found by a plain substring search."""
_NINETEEN_DIGITS = b"0" * 19
"""2**63 has 19 digits: JSON without such a run of digits holds no integer beyond 64
bits, and skips the walk that looks for one. (Translating and searching costs about a
tenth of a regular expression's ``\\d{19}`` search.)"""


def beyond_64_bits(raw: bytes) -> bool:
    """Whether the JSON ``raw`` holds an integer outside -2**63 .. 2**64-1."""
    if _NINETEEN_DIGITS not in raw.translate(_DIGITS_ONLY):
        return False
    stack: list[Any] = [msgspec.json.decode(raw)]
    while stack:
        item = stack.pop()
        if isinstance(item, int):
            if not -(2**63) <= item < 2**64:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
