"""bench.flow's checks of the rate scenario find each broken promise, on made-up counts
(the e2e test runs them on real ones)."""

from __future__ import annotations

from bench.flow import SCENARIOS, Counts, Rate


def rate(**changes: object) -> Rate:
    r = Rate("fraction", rpm=600, sessions=50, turns=100, elapsed=20.0)
    r.start = Counts(at=5.0, received=40, served=32, refused=8)
    r.end = Counts(at=20.0, received=190, served=152, refused=38)
    for name, value in changes.items():
        setattr(r, name, value)
    return r


def test_counts_that_keep_the_promises_are_no_problem() -> None:
    r = rate()
    assert r.problems() == []
    assert r.allowed() == 600 / 60 * 21 + 1  # R over the run, and the gate's burst of 1 s
    assert r.per_minute("served") == 120 / 15 * 60


def test_a_failed_turn_an_attempt_used_and_calls_over_the_rate_are_each_found() -> None:
    assert rate(failed=2).problems()[0].startswith("2 turns failed")
    assert rate(extra_attempts=3).problems() == ["refusals used 3 attempts"]
    over = rate(end=Counts(at=20.0, received=212, served=170, refused=42)).problems()
    assert over == [
        "212 calls reached the provider, more than the 211 that 600 rpm allows in 20.0 s"
    ]


def test_the_ceilings_of_the_scenarios() -> None:
    assert SCENARIOS["fraction"].ceiling(600) == 240  # 4 served each second of Retry-After
    assert SCENARIOS["above"].ceiling(600) == 600
    assert SCENARIOS["below"].ceiling(600) == 540
