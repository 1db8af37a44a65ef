"""The machine's Redis, for the tests of serving through it: a database of its own for each test process, or
a skip where Redis is not installed or not reachable.

A test process claims a database that is empty, by writing a claim key into it in the same step as it checks
that it is empty; it then empties it of its own keys between tests and of everything at the end. It never
touches a database it did not find empty, so other users of the same Redis, and other test runs (each worker
of ``pytest -n`` is one), keep theirs.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any

import pytest

REDIS = "redis://127.0.0.1:6379"
CLAIM_KEY = "cachet-tests:claimed"
CLAIM_SECONDS = 6 * 60 * 60  # a run that dies leaves its claim this long at most
CLAIM = """
if redis.call('DBSIZE') == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
EMPTY = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('this database is not claimed by this test process')
end
local removed = 0
for _, key in ipairs(redis.call('KEYS', '*')) do
  if key ~= KEYS[1] then
    redis.call('DEL', key)
    removed = removed + 1
  end
end
return removed
"""


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


@dataclass
class RedisDatabase:
    """A database of the machine's Redis that this test process claimed while it was empty."""

    number: int
    client: Any
    token: str

    @property
    def url(self) -> str:
        return f"{REDIS}/{self.number}"

    def empty(self) -> None:
        """Remove every key but the claim: all of them were made by this test process."""
        self.client.eval(EMPTY, 1, CLAIM_KEY, self.token)

    def release(self) -> None:
        self.empty()
        self.client.delete(CLAIM_KEY)
        self.client.close()


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, … under pytest-xdist
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def claim_database() -> RedisDatabase:
    """An empty database of the machine's Redis, claimed for this test process: counted down from the last one
    by the xdist worker's number (database 0, which applications use by default, is never taken)."""
    probe = redis_client(REDIS)
    try:
        count = int(probe.config_get("databases").get("databases", 16))
    finally:
        probe.close()
    last = count - 1
    first = last - _worker_index() % last
    order = [*range(first, 0, -1), *range(last, first, -1)]
    token = secrets.token_hex(16)
    for number in order:
        client = redis_client(f"{REDIS}/{number}")
        if client.eval(CLAIM, 1, CLAIM_KEY, token, CLAIM_SECONDS) == 1:
            return RedisDatabase(number, client, token)
        client.close()
    pytest.skip(f"no database of the Redis at {REDIS} is empty; these tests need one of their own")
