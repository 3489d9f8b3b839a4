"""``dex._failpoints``: a spec is read as the TypeScript and Go Workers read it, and one
it cannot read is refused by name (the process does not start)."""

from __future__ import annotations

import re

import pytest

from dex import _failpoints as failpoints


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("worker.tool_running=pasue", 'unknown action "pasue" (crash, pause, stop or error)'),
        ("a=crash,worker.tool_running=Pause", 'unknown action "Pause"'),
        ("worker.tool_running", "not NAME=ACTION"),
        ("=crash", "not NAME=ACTION"),
        ("worker.tool_running=pause@0", 'the hit number "0" is not a positive integer'),
        ("worker.tool_running=pause@two", 'the hit number "two" is not a positive integer'),
        ("worker.tool_running=crash@", 'the hit number "" is not a positive integer'),
    ],
)
def test_a_spec_it_cannot_read_is_refused_naming_the_part(spec: str, why: str) -> None:
    part = spec.split(",")[-1]
    start = re.escape(f'DEX_FAILPOINTS: "{part}": ')
    with pytest.raises(ValueError, match=f"^{start}") as refused:
        failpoints._parse(spec)
    assert why in str(refused.value)


def test_a_well_formed_spec_arms_its_points() -> None:
    assert failpoints._parse(" a=crash, b=pause@3 ,c=stop@arm,d=error,") == {
        "a": ("crash", 1),
        "b": ("pause", 3),
        "c": ("stop", failpoints.ARM),
        "d": ("error", 1),
    }
