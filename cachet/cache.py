"""Django's cache where ``REDIS_URL`` is set: Redis, but a page never fails because Redis is away.

While Redis cannot be reached, the cache is a local-memory one of this process (login failure counters count
per process, rendered markdown is rendered again): one warning when Redis goes, one line when it is back, and
Redis is tried again at most every ``RETRY_SECONDS``, so a page waits on a dead Redis at most that often. A
stale pooled connection (Redis restarted) is tried once more on a new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

logger = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
CONNECT_TIMEOUT = 0.5
SOCKET_TIMEOUT = 2.0
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)


def _fallback(name: str) -> Callable[..., Any]:
    def method(self: ResilientRedisCache, *args: Any, **kwargs: Any) -> Any:
        if self.down_until > time.monotonic():
            return getattr(self.local, name)(*args, **kwargs)
        try:
            result = getattr(super(ResilientRedisCache, self), name)(*args, **kwargs)
        except UNREACHABLE as error:
            self._lost(error)
            return getattr(self.local, name)(*args, **kwargs)
        if self.down_since is not None:
            self._back()
        return result

    method.__name__ = name
    return method


class ResilientRedisCache(RedisCache):
    """``RedisCache`` that answers from a local-memory cache while Redis is out of reach."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        options = {
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_timeout": SOCKET_TIMEOUT,
            "retry": Retry(NoBackoff(), 1),
            **params.get("OPTIONS", {}),
        }
        super().__init__(server, {**params, "OPTIONS": options})
        self.local = LocMemCache(f"cachet-fallback-{id(self)}", {"OPTIONS": {"MAX_ENTRIES": 20_000}})
        self.down_until = 0.0
        self.down_since: float | None = None
        self._state = threading.Lock()

    def _lost(self, error: BaseException) -> None:
        with self._state:
            self.down_until = time.monotonic() + RETRY_SECONDS
            if self.down_since is None:
                self.down_since = time.monotonic()
                logger.warning("the cache cannot reach Redis (%s); using this process's memory meanwhile", error)

    def _back(self) -> None:
        with self._state:
            if self.down_since is None:
                return
            logger.info("the cache reaches Redis again after %.1f s", time.monotonic() - self.down_since)
            self.down_since = None

    get = _fallback("get")
    set = _fallback("set")
    add = _fallback("add")
    touch = _fallback("touch")
    delete = _fallback("delete")
    get_many = _fallback("get_many")
    set_many = _fallback("set_many")
    delete_many = _fallback("delete_many")
    has_key = _fallback("has_key")
    incr = _fallback("incr")
    clear = _fallback("clear")
