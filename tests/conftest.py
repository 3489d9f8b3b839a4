"""Project-wide pytest options and fixtures for every test directory.

- ``--write-crash-matrix PATH`` writes docs/crash-matrix.md from the results of the run's
  crash tests; ``--check-crash-matrix PATH`` fails the run when the page those results
  write differs from PATH; ``--list-crash-marks PATH`` writes the collected crash marks
  as JSON (``tests.support.crash_matrix``).
- ``--fail-on-skip`` (or ``DEX_FAIL_ON_SKIP=1``, or ``CI=true``) fails the run on a skip
  that the reviewed allow-list does not name (``tests.support.skips``).
- A PostgreSQL database (``postgres_url``) and Redis (``redis_url``), each skipped when it
  cannot be reached (a skip that ``--fail-on-skip`` fails).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import skips
from tests.support.crash_matrix import CrashResults, mark_cells
from tests.support.postgres import postgres_database, postgres_url
from tests.support.redis import redis_url

__all__ = ["postgres_database", "postgres_url", "redis_url"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-crash-matrix",
        metavar="PATH",
        default=None,
        help="write the crash matrix page from the results of the run's crash tests",
    )
    parser.addoption(
        "--check-crash-matrix",
        metavar="PATH",
        default=None,
        help="fail the run when the crash matrix page its results write differs from PATH",
    )
    parser.addoption(
        "--list-crash-marks",
        metavar="PATH",
        default=None,
        help="write the collected crash marks (row, column, file, Worker) as JSON",
    )
    parser.addoption(
        skips.OPTION,
        action="store_true",
        default=False,
        help=f"fail the run on a skip the allow-list does not name (or {skips.ENV}=1, CI=true)",
    )


def pytest_configure(config: pytest.Config) -> None:
    skips.register(config)
    write = config.getoption("--write-crash-matrix")
    check = config.getoption("--check-crash-matrix")
    if (write or check) and config.getoption("--collect-only"):
        raise pytest.UsageError(
            "the crash matrix page is written from test results: run the crash tests "
            "(without --collect-only)"
        )
    if (write or check) and not hasattr(config, "workerinput"):  # xdist's controller
        config.pluginmanager.register(CrashResults(write, check), "dex-crash-results")


def pytest_collection_finish(session: pytest.Session) -> None:
    cells = mark_cells(session.items, Path(session.config.rootpath))
    target = session.config.getoption("--list-crash-marks")
    if target:
        Path(target).write_text(json.dumps(cells))
