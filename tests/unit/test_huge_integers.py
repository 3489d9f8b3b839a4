"""The Worker channel refuses a frame holding an integer JSON cannot carry on (beyond 64
bits) and accepts every other frame, whatever digits its strings and floats hold: a quick
search for a run of 19 digits decides whether the frame is walked at all. Neither side's
outbox sends such an integer either (``dex.wire.integers``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex.server.api.workers import BadFrame, _no_huge_integer
from dex.wire.integers import beyond_64_bits

FITS = st.integers(-(2**63), 2**64 - 1)
BEYOND = st.integers(2**64, 10**40) | st.integers(-(10**40), -(2**63) - 1)
DIGITS = st.text("0123456789", min_size=15, max_size=45)
scalars = (
    st.none()
    | st.booleans()
    | FITS
    | BEYOND
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | DIGITS
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


def _holds_huge(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -(2**63) <= value < 2**64
    if isinstance(value, list):
        return any(_holds_huge(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_huge(v) for v in value.values())
    return False


@settings(max_examples=500, deadline=None)
@given(value=values)
def test_a_frame_is_refused_exactly_when_it_holds_an_integer_beyond_64_bits(value: Any) -> None:
    for raw in (json.dumps(value), json.dumps(value).encode()):
        if _holds_huge(value):
            with pytest.raises(BadFrame, match="beyond 64 bits"):
                _no_huge_integer(raw)
        else:
            _no_huge_integer(raw)
    # what either side's outbox leaves out of a frame it sends (dex.wire.outbox)
    assert beyond_64_bits(json.dumps(value).encode()) == _holds_huge(value)


@pytest.mark.parametrize(
    "raw",
    [
        '[{"t":"hb","seq":18446744073709551616}]',
        '[{"t":"hb","seq":-9223372036854775809}]',
        '{"a":[1,{"b":"x"},123456789012345678901234567890]}',
    ],
)
def test_the_smallest_and_the_buried_are_refused(raw: str) -> None:
    with pytest.raises(BadFrame):
        _no_huge_integer(raw.encode())


@pytest.mark.parametrize(
    "raw",
    [
        '[{"t":"hb","seq":18446744073709551615,"low":-9223372036854775808}]',
        '{"id":"12345678901234567890123","f":1.2345678901234567890123e5}',
        '{"é":"ü","n":1234567890123456789}',
    ],
)
def test_the_largest_that_fit_and_long_digit_strings_are_accepted(raw: str) -> None:
    _no_huge_integer(raw)
    _no_huge_integer(raw.encode())
