"""Dex across a PostgreSQL failover, with real parts: etcd, two PostgreSQL servers run by
Patroni with synchronous replication and HAProxy routing to the primary
(``scripts/patroni``, a cluster of its own on free ports: the shared PostgreSQL is not
touched). The primary's postmaster is SIGKILLed while a single-attempt write runs; Patroni
promotes the standby, the Dex nodes step down and, started again by a supervisor, serve
with a higher epoch. The short form of ``bench.patroni``, which does the checking."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.patroni import Patroni, report, run


@pytest.fixture(scope="session")
def patroni() -> Iterator[Patroni]:
    cluster = Patroni()
    try:
        cluster.start()
    except RuntimeError as e:  # a skip fails scripts/test and CI (tests.support.skips)
        cluster.stop()
        pytest.skip(f"no Patroni cluster: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(300)
def test_a_postgresql_failover_loses_no_acknowledged_write_and_runs_no_write_twice(
    patroni: Patroni, tmp_path: Path
) -> None:
    began = time.monotonic()
    result = run(1, tmp_path, patroni)
    took = time.monotonic() - began
    print("\n".join([*report(1, "kill", result), f"  the round took {took:.1f} s"]))
    assert result.problems == []  # nothing lost, nothing twice, every turn completed
    assert len(result.gaps) == 1 and result.lost == [] and result.duplicated == 0
    # the checks had something to hold: turns ran on both sides of the failover, and the
    # write the kill aimed at ran (succeeded, or outcome_unknown: at most once)
    assert result.turns >= 3 and result.runs >= result.writes["succeeded"] >= 2
    assert result.epochs[-1] > result.epochs[0]
    assert result.exits[4] >= 1  # a node that lost its database stepped down (status 4)
    assert result.gaps[0] < 30, f"Dex served again {result.gaps[0]:.1f} s after the kill"
