"""``scripts/services`` leaves PostgreSQL and Redis reachable, or fails loudly: a non-zero
exit with one message naming what cannot be reached (never a run whose tests then skip)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def _services(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/services"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_with_the_services_reachable_it_succeeds_quietly() -> None:
    done = _services()
    assert (done.returncode, done.stderr) == (0, "")


def test_a_postgresql_that_cannot_be_reached_fails_it_with_one_message() -> None:
    closed = "postgresql://postgres@127.0.0.1:1/postgres"
    done = _services(DEX_TEST_POSTGRES=closed, DEX_SERVICES_TIMEOUT="1")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"scripts/services: PostgreSQL does not accept a connection without a password at "
        f"{closed}: the PostgreSQL tests (the takeover, failover and lease tests among them) "
        "cannot run (gave up after 1s)"
    ]


def test_a_redis_that_cannot_be_reached_fails_it_with_one_message() -> None:
    closed = "redis://127.0.0.1:1/0"
    done = _services(DEX_TEST_REDIS=closed, DEX_SERVICES_TIMEOUT="1")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"scripts/services: Redis does not answer at {closed}: the stream tests cannot run "
        "(gave up after 1s)"
    ]
