"""Settings from the environment: ``CACHET_TLS`` switches on what serving behind TLS needs, the production
settings pass ``manage.py check --deploy`` without a warning, the channel layer crosses processes (Postgres,
or Redis's pub/sub with ``REDIS_URL``), and with ``REDIS_URL`` the channel layer keeps an idle tab's consumer
waiting."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings

from cachet.redis_layer import RedisPubSubLayer
from tests.redis_kit import RedisDatabase

PRODUCTION_KEY = "tUv3kP9qXw2zR7mN4bJ8sL1cY6hG0fD5aE-x_QoWiVnTrMkSjZlHgF"
UNREACHABLE_DATABASE = "postgres://cachet@127.0.0.1:9/cachet"  # settings and checks never connect
DROPPED = {
    "DATABASE_URL",
    "DEBUG",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "CACHET_TLS",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_PRELOAD",
}
SHOWN = [
    "DEBUG",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_PROXY_SSL_HEADER",
    "USE_X_FORWARDED_HOST",
    "SILENCED_SYSTEM_CHECKS",
]


def environment(tmp_path: Path, **values: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in DROPPED and not key.startswith("PYTEST")}
    env.update(
        CACHET_DATA=str(tmp_path / "data"),
        DATABASE_URL=UNREACHABLE_DATABASE,
        DJANGO_SETTINGS_MODULE="cachet.settings",
        **values,
    )
    return env


def settings_under(tmp_path: Path, names: list[str] = SHOWN, **values: str) -> dict[str, Any]:
    code = (
        "import json; from django.conf import settings; "
        f"print(json.dumps({{name: getattr(settings, name) for name in {names!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=environment(tmp_path, **values),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def test_without_cachet_tls_nothing_assumes_https(tmp_path: Path) -> None:
    assert settings_under(tmp_path) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_PROXY_SSL_HEADER": None,
        "USE_X_FORWARDED_HOST": False,
        "SILENCED_SYSTEM_CHECKS": [],
    }


def test_cachet_tls_switches_on_secure_cookies_hsts_the_proxy_header_and_the_redirect(tmp_path: Path) -> None:
    assert settings_under(tmp_path, CACHET_TLS="1") == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "USE_X_FORWARDED_HOST": False,
        "SILENCED_SYSTEM_CHECKS": ["security.W021"],
    }


def test_hsts_can_be_set_apart_and_preloaded_on_request(tmp_path: Path) -> None:
    shown = settings_under(tmp_path, CACHET_TLS="1", SECURE_HSTS_SECONDS="3600", SECURE_HSTS_PRELOAD="1")
    assert (shown["SECURE_HSTS_SECONDS"], shown["SECURE_HSTS_PRELOAD"], shown["SILENCED_SYSTEM_CHECKS"]) == (
        3600,
        True,
        [],
    )
    assert settings_under(tmp_path, USE_X_FORWARDED_HOST="true")["USE_X_FORWARDED_HOST"] is True


COOKIES = ["SESSION_COOKIE_NAME", "CSRF_COOKIE_NAME", "CACHET_LOGIN_COOKIE_NAME"]


def test_the_cookies_are_named_for_the_instance_the_same_in_each_of_its_processes(tmp_path: Path) -> None:
    """Two Cachets on one host name (cookies ignore ports) had both used Django's ``sessionid`` and ``csrftoken``:
    a login to one overwrote the other's, and each received the other's login cookie."""
    ours = settings_under(tmp_path, COOKIES, SECRET_KEY=PRODUCTION_KEY)
    theirs = settings_under(tmp_path, COOKIES, SECRET_KEY=PRODUCTION_KEY[::-1])
    assert settings_under(tmp_path, COOKIES, SECRET_KEY=PRODUCTION_KEY) == ours, "the same after a restart"
    assert re.fullmatch(r"cachet-[0-9a-f]{8}-session", ours["SESSION_COOKIE_NAME"]), ours
    prefix = ours["SESSION_COOKIE_NAME"].removesuffix("-session")
    assert ours == {
        "SESSION_COOKIE_NAME": f"{prefix}-session",
        "CSRF_COOKIE_NAME": f"{prefix}-csrf",
        "CACHET_LOGIN_COOKIE_NAME": f"{prefix}-login",
    }
    assert not set(ours.values()) & set(theirs.values())
    assert PRODUCTION_KEY[:8] not in prefix
    generated = settings_under(tmp_path, COOKIES)
    assert not (tmp_path / "data").exists(), "a generated key is not made by reading the settings"
    assert settings_under(tmp_path, COOKIES) == generated
    assert settings_under(tmp_path / "elsewhere", COOKIES) != generated, "another data folder, another instance"
    tls = settings_under(tmp_path, COOKIES, SECRET_KEY=PRODUCTION_KEY, CACHET_TLS="1")
    assert tls == {name: f"__Host-{value}" for name, value in ours.items()}


def test_the_channel_layer_crosses_processes_over_postgres_or_redis_always(tmp_path: Path) -> None:
    def chosen(**values: str) -> tuple[str, str]:
        shown = settings_under(tmp_path, ["CHANNEL_LAYERS", "CACHES"], **values)
        return shown["CHANNEL_LAYERS"]["default"]["BACKEND"], shown["CACHES"]["default"]["BACKEND"]

    locmem = "django.core.cache.backends.locmem.LocMemCache"
    assert chosen() == ("cachet.pg_layer.PostgresChannelLayer", locmem)
    with_redis = chosen(REDIS_URL="redis://127.0.0.1:9/0")
    assert with_redis == ("cachet.redis_layer.RedisPubSubLayer", "cachet.cache.ResilientRedisCache")
    assert chosen(REDIS_URL="redis://127.0.0.1:9/0", CACHET_CHANNEL_LAYER="postgres")[0] == (
        "cachet.pg_layer.PostgresChannelLayer"
    )
    for refused_layer in ("carrier-pigeon", "memory"):  # memory reached no tab: replies run in workers
        refused = subprocess.run(
            [sys.executable, "-c", "from django.conf import settings; settings.CHANNEL_LAYERS"],
            cwd=settings.BASE_DIR,
            env=environment(tmp_path, CACHET_CHANNEL_LAYER=refused_layer),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0
        assert "CACHET_CHANNEL_LAYER is postgres or redis" in refused.stderr


def test_with_redis_a_consumer_idle_past_the_read_timeout_still_gets_its_message(
    tmp_path: Path, redis_database: RedisDatabase
) -> None:
    """An idle tab's consumer outlives Redis's read timeout: a read timeout of 5 s on a blocking pop of 5 s had
    made every idle consumer fail, and its tab's socket close, after 5 s."""
    url = redis_database.url
    redis_database.empty()
    layers = settings_under(tmp_path, ["CHANNEL_LAYERS", "REDIS_SOCKET_TIMEOUT"], REDIS_URL=url)
    assert layers["CHANNEL_LAYERS"]["default"]["BACKEND"] == "cachet.redis_layer.RedisPubSubLayer"
    layer = RedisPubSubLayer(**layers["CHANNEL_LAYERS"]["default"]["CONFIG"])

    async def idle_then_message() -> dict[str, Any]:
        channel = await layer.new_channel()
        waiting = asyncio.create_task(layer.receive(channel))
        await asyncio.sleep(layers["REDIS_SOCKET_TIMEOUT"] + 1.5)  # idle on purpose, past the read timeout
        assert not waiting.done(), waiting.exception()
        await layer.send(channel, {"type": "turn.event", "n": 1})
        message: dict[str, Any] = await asyncio.wait_for(waiting, 5)
        await layer.flush()
        return message

    try:
        assert asyncio.run(idle_then_message()) == {"type": "turn.event", "n": 1}
    finally:
        redis_database.empty()


def check_deploy(tmp_path: Path, **values: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=settings.BASE_DIR,
        env=environment(tmp_path, **values),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_with_the_production_settings(tmp_path: Path) -> None:
    done = check_deploy(
        tmp_path, DEBUG="false", SECRET_KEY=PRODUCTION_KEY, CACHET_TLS="1", ALLOWED_HOSTS="cachet.example"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr


def test_check_deploy_warns_without_cachet_tls(tmp_path: Path) -> None:
    done = check_deploy(tmp_path, DEBUG="false", SECRET_KEY=PRODUCTION_KEY, ALLOWED_HOSTS="cachet.example")
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr, done.stderr
