"""A skipped test fails the run unless the reviewed allow-list names it
(``tests.support.skips``), and crash, failover, lease, stream and browser tests can never
be on that list."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.skips import ALLOWED, ENV, Allowed, check_allowed, is_allowed

ROOT = Path(__file__).parent.parent.parent
CLOSED = "postgresql://postgres@127.0.0.1:1/postgres"
"""A PostgreSQL URL on a port nothing listens on."""


SELECTION = [
    "tests/unit/test_migrations.py::test_postgres_migrations_give_the_sqlite_indexes",
    "tests/unit/test_migrations.py::test_postgres_nodes_starting_at_once_run_each_migration_once",
    "tests/unit/test_migrations.py::test_migration_files_are_numbered_from_1_without_gaps",
]
"""Two tests that need PostgreSQL, and two that do not."""


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The selection with PostgreSQL on a closed port."""
    clean = {k: v for k, v in os.environ.items() if k not in (ENV, "CI")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *SELECTION, *args],
        cwd=ROOT,
        env={**clean, "DEX_TEST_POSTGRES": CLOSED, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_with_postgresql_unreachable_the_checked_run_fails_naming_each_skip() -> None:
    """In two pytest-xdist processes, as ``scripts/test`` runs the suite."""
    done = _run("-n", "2", env={ENV: "1"})
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "2 passed, 2 skipped" in done.stdout
    assert "2 tests skipped that tests/support/skips.py's ALLOWED does not name" in done.stdout
    skipped = sorted(line for line in done.stdout.splitlines() if line.startswith("SKIPPED t"))
    assert [line.split(":", 3)[2] for line in skipped] == [
        "test_postgres_migrations_give_the_sqlite_indexes",
        "test_postgres_nodes_starting_at_once_run_each_migration_once",
    ], done.stdout
    for line in skipped:
        assert f"PostgreSQL is not reachable at {CLOSED}" in line


@pytest.mark.parametrize(
    ("args", "env"), [(["--fail-on-skip"], {}), ([], {"CI": "true"})], ids=["option", "ci"]
)
def test_the_option_or_ci_asks_for_the_check_too(args: list[str], env: dict[str, str]) -> None:
    done = _run(*args, env=env)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "unexpected skips" in done.stdout


def test_by_hand_without_the_check_the_same_skips_leave_the_run_green() -> None:
    done = _run(env={})
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "2 passed, 2 skipped" in done.stdout
    assert "unexpected skips" not in done.stdout


def test_the_committed_allow_list_gives_a_reason_for_each_entry() -> None:
    check_allowed(ALLOWED)
    assert len(ALLOWED) <= 5  # short, and reviewed


@pytest.mark.parametrize(
    "test",
    [
        "tests/crash/test_call_tool.py::test_a_read_runs_again[takeover]",
        "tests/browser/test_console.py::test_the_console_lists_sessions",
        "tests/e2e/test_failover_more.py::test_after_postgresql_restarts_exactly_one_node_leads",
        "tests/integration/test_lease.py::test_of_two_contenders_exactly_one_wins",
        "tests/integration/test_streams_redis.py::test_events_reach_the_stream",
        "tests/e2e/test_postgres.py::test_a_takeover_keeps_the_history",
    ],
)
def test_a_test_that_must_run_cannot_be_allowed_to_skip(test: str) -> None:
    with pytest.raises(pytest.UsageError, match="may never skip"):
        check_allowed((Allowed(test, "PostgreSQL is not reachable", "no PostgreSQL here"),))


@pytest.mark.parametrize(
    "test",
    [
        "tests/unit/test_release_notes.py::test_the_notes_list_each_release",
        "tests/integration/test_api.py::test_the_event_stream_ends_with_the_turn",
    ],
)
def test_other_tests_may_be_on_the_list(test: str) -> None:
    check_allowed((Allowed(test, "needs root", "reviewed"),))


def test_an_entry_without_a_reason_is_refused() -> None:
    with pytest.raises(pytest.UsageError, match="needs a reason"):
        check_allowed((Allowed("tests/unit/test_x.py::test_y", "", "because"),))


def test_an_allowed_test_may_skip_only_for_its_reason() -> None:
    entry = Allowed("tests/e2e/test_x.py::test_y", "needs root", "reviewed")
    assert is_allowed("tests/e2e/test_x.py::test_y[tmpfs]", "needs root to mount", (entry,))
    assert is_allowed("tests/e2e/test_x.py::test_y", "needs root", (entry,))
    assert not is_allowed("tests/e2e/test_x.py::test_y", "PostgreSQL is down", (entry,))
    assert not is_allowed("tests/e2e/test_x.py::test_y_more", "needs root", (entry,))
