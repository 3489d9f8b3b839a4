"""Failover under load, on PostgreSQL: the active node fails again and again while a
client runs turns; each time the standby takes over with a higher epoch, every turn
completes exactly once, and exactly one node serves. The figures are in bench.takeover."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.takeover import run


@pytest.mark.parametrize(("fault", "times"), [("kill", 20), ("stop", 1), ("term", 2)])
def test_the_standby_takes_over_and_no_turn_is_lost_or_doubled(
    postgres_url: str, tmp_path: Path, fault: str, times: int
) -> None:
    result = run(times, fault, tmp_path, postgres_url)
    assert result.problems == []
    assert len(result.gaps) == times
    assert result.epochs == sorted(set(result.epochs)) and len(result.epochs) == times + 1
