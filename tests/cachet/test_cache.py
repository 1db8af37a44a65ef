"""Django's cache with ``REDIS_URL``: while Redis is away it is this process's memory, with one warning, and
pages answer; once Redis is back (looked at again after a pause) it is Redis again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client, override_settings
from django.urls import reverse

from cachet import cache as cache_module
from cachet.cache import RETRY_SECONDS, ResilientRedisCache
from sessions_app.models import ChatSession
from tests.cachet.proxy_kit import Proxy, proxy
from tests.clock import Clock
from tests.redis_kit import REDIS, RedisDatabase

AWAY = "redis://127.0.0.1:9/0"  # nothing listens on the discard port


@pytest.fixture
def through(redis_database: RedisDatabase) -> Iterator[tuple[Proxy, ResilientRedisCache]]:
    redis_database.empty()
    host, port = REDIS.removeprefix("redis://").split(":")
    with proxy((host, int(port))) as made:
        yield made, ResilientRedisCache(f"{made.url}/{redis_database.number}", {})
    redis_database.empty()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "cachet.cache" and record.levelno >= logging.WARNING]


def test_while_redis_is_away_the_cache_is_this_process_s_memory_with_one_warning(
    through: tuple[Proxy, ResilientRedisCache], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_proxy, shared = through
    clock = Clock()
    monkeypatch.setattr(cache_module, "time", clock)
    caplog.set_level(logging.INFO, logger="cachet.cache")
    shared.set("kept", "in redis", timeout=60)
    assert shared.get("kept") == "in redis"

    redis_proxy.cut()
    assert shared.get("kept") is None
    assert shared.add("failures", 0, timeout=60)
    assert shared.incr("failures") == 1
    shared.set("local", "here", timeout=60)
    assert shared.get_many(["local", "failures"]) == {"local": "here", "failures": 1}
    connections = redis_proxy.connections
    for _ in range(10):
        shared.get("kept")
    assert redis_proxy.connections == connections  # not tried again before the pause is over
    assert len(_warnings(caplog)) == 1
    assert all(record.exc_info is None for record in caplog.records)

    redis_proxy.mend()
    clock.advance(RETRY_SECONDS + 0.1)
    assert shared.get("kept") == "in redis"  # a stale pooled connection, tried once more on a new one
    assert any("reaches Redis again" in record.getMessage() for record in caplog.records)
    assert len(_warnings(caplog)) == 1


@pytest.mark.django_db
def test_pages_answer_while_redis_is_away(client: Client, user: Any, chat_session: ChatSession) -> None:
    away = {"default": {"BACKEND": "cachet.cache.ResilientRedisCache", "LOCATION": AWAY}}
    with override_settings(CACHES=away):
        assert isinstance(caches["default"], ResilientRedisCache)
        assert client.get(reverse("login")).status_code == 200
        refused = client.post(reverse("login"), {"username": user.username, "password": "wrong"})
        assert refused.status_code == 200
        client.force_login(user)
        assert client.get(reverse("home")).status_code == 200
        assert client.get(reverse("session", args=[chat_session.pk])).status_code == 200
