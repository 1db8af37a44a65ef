"""The machine's Redis, for the tests of serving through it: a client of one database, or a skip."""

from __future__ import annotations

from typing import Any

import pytest

REDIS = "redis://127.0.0.1:6379"


def redis_client(url: str) -> Any:
    """A client of ``url`` that answers; the test is skipped where Redis is not installed or not reachable."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        client.close()
        pytest.skip(f"Redis is not reachable at {url} ({error}); this test needs it")
    return client
