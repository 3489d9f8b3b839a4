"""A fresh PostgreSQL database for the test session, and an empty schema per test.

The server is the one ``scripts/services`` starts: ``127.0.0.1:5432``, user ``postgres``,
trust auth (``DEX_TEST_POSTGRES`` names another admin URL). Tests that need it are skipped
only when it cannot be reached, and such a skip fails ``scripts/test`` and CI
(``tests.support.skips``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest

ADMIN_URL = os.environ.get("DEX_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _url(database: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + database


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """The URL of a database created for this test session, dropped after it."""
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL is not reachable at {ADMIN_URL}: {e}")
    name = "dex_test_" + secrets.token_hex(6)
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield _url(name)
    finally:
        # a new connection: a test may have restarted PostgreSQL meanwhile
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as again:
            again.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def postgres_url(postgres_database: str) -> str:
    """The session's database, emptied: no tables, no lock holders from earlier tests."""
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return postgres_database
