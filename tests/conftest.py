"""Project-wide pytest options and fixtures for every test directory.

- ``--write-crash-matrix PATH`` writes docs/crash-matrix.md from the ``crash`` marks of
  the collected tests.
- ``--fail-on-skip`` (or ``DEX_FAIL_ON_SKIP=1``, or ``CI=true``) fails the run on a skip
  that the reviewed allow-list does not name (``tests.support.skips``).
- A PostgreSQL database (``postgres_url``) and Redis (``redis_url``), each skipped when it
  cannot be reached (a skip that ``--fail-on-skip`` fails).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import skips
from tests.support.crash_matrix import check_mark, render
from tests.support.postgres import postgres_database, postgres_url
from tests.support.redis import redis_url

__all__ = ["postgres_database", "postgres_url", "redis_url"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-crash-matrix",
        metavar="PATH",
        default=None,
        help="write the crash matrix page from the collected crash tests",
    )
    parser.addoption(
        skips.OPTION,
        action="store_true",
        default=False,
        help=f"fail the run on a skip the allow-list does not name (or {skips.ENV}=1, CI=true)",
    )


def pytest_configure(config: pytest.Config) -> None:
    skips.register(config)


def pytest_collection_finish(session: pytest.Session) -> None:
    marks = []
    root = Path(session.config.rootpath)
    for item in session.items:
        for mark in item.iter_markers("crash"):
            row, column = mark.args
            check_mark(row, column)
            worker = str(mark.kwargs.get("worker", "python"))
            marks.append((row, column, str(Path(item.path).relative_to(root)), worker))
    target = session.config.getoption("--write-crash-matrix")
    if target:
        Path(target).write_text(render(marks))
