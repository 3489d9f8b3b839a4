"""Redis for the stream tests: the one ``scripts/services`` starts, ``127.0.0.1:6379``
(``DEX_TEST_REDIS`` names another). Tests that need it are skipped only when it cannot be
reached, a skip that fails ``scripts/test`` and CI (``tests.support.skips``); each test's
keys are deleted after it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

URL = os.environ.get("DEX_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The URL of a reachable Redis; the ``dex*`` keys the test made are deleted after it."""
    client = redis.Redis.from_url(URL, socket_connect_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, OSError) as e:
        pytest.skip(f"Redis is not reachable at {URL}: {e}")
    before = set(client.scan_iter("dex*"))
    try:
        yield URL
    finally:
        made = set(client.scan_iter("dex*")) - before
        if made:
            client.delete(*made)
        client.close()
