"""The websocket origin rule: the page's origin must be exactly (scheme, host, port) one Cachet serves.

Each case is checked twice: against :func:`origin_allowed` alone, and as a handshake through the real ASGI
application (exact origin check, Channels' allowed hosts check, the session login, the routes) with a valid
login cookie, so that a refusal can only come from the origin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from channels.testing import ApplicationCommunicator
from django.conf import settings
from django.test import Client, override_settings

from cachet.asgi import application
from cachet.origins import Origin, OriginPattern, origin_allowed, own_origin, parse_origin, parse_pattern
from sessions_app.models import ChatSession

PROXY = ("HTTP_X_FORWARDED_PROTO", "https")


@dataclass(frozen=True)
class Case:
    name: str
    origins: tuple[str, ...]
    host: str | None
    allowed: bool
    scheme: str = "ws"
    headers: tuple[tuple[str, str], ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    loopback: bool = True  # its hosts are in the test ALLOWED_HOSTS, so it can go through the whole application

    def scope(self, path: str = "/ws/sessions/1/", cookie: str | None = None) -> dict[str, Any]:
        headers = [(b"origin", origin.encode("latin1")) for origin in self.origins]
        if self.host is not None:
            headers.append((b"host", self.host.encode()))
        headers += [(name.encode(), value.encode()) for name, value in self.headers]
        if cookie is not None:
            headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
        return {
            "type": "websocket",
            "scheme": self.scheme,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "subprotocols": [],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }

    def overrides(self) -> dict[str, Any]:
        return {"CSRF_TRUSTED_ORIGINS": [], "SECURE_PROXY_SSL_HEADER": None, "USE_X_FORWARDED_HOST": False} | dict(
            self.settings
        )


CASES = [
    Case("own origin", ("http://127.0.0.1:8000",), "127.0.0.1:8000", True),
    Case("another port of the same host", ("http://127.0.0.1:8399",), "127.0.0.1:8000", False),
    Case("another port, named", ("http://localhost:8399",), "localhost:8000", False),
    Case("https page to a plain ws", ("https://127.0.0.1:8000",), "127.0.0.1:8000", False),
    Case("another host name of the same machine", ("http://localhost:8000",), "127.0.0.1:8000", False),
    Case("default port in the origin only", ("http://localhost:80",), "localhost", True),
    Case("default port in the host only", ("http://localhost",), "localhost:80", True),
    Case("port 80 is not port 8000", ("http://localhost",), "localhost:8000", False),
    Case("wss is https", ("https://localhost",), "localhost", True, scheme="wss"),
    Case("wss with the port written", ("https://localhost:443",), "localhost", True, scheme="wss"),
    Case("wss from an http page", ("http://localhost",), "localhost", False, scheme="wss"),
    Case("wss on another port", ("https://localhost:8443",), "localhost:8443", True, scheme="wss"),
    Case("case of scheme and host", ("HTTP://LocalHost:8000",), "localhost:8000", True),
    Case("IPv6 loopback", ("http://[::1]:8000",), "[::1]:8000", True),
    Case("IPv6 loopback, another port", ("http://[::1]:8001",), "[::1]:8000", False),
    Case("no Origin header", (), "127.0.0.1:8000", False),
    Case("Origin null", ("null",), "127.0.0.1:8000", False),
    Case("two Origin headers", ("http://127.0.0.1:8000", "http://127.0.0.1:8000"), "127.0.0.1:8000", False),
    Case("an origin with a path", ("http://127.0.0.1:8000/",), "127.0.0.1:8000", False),
    Case("an origin with a user", ("http://ada@127.0.0.1:8000",), "127.0.0.1:8000", False),
    Case("an origin with a bad port", ("http://127.0.0.1:99999",), "127.0.0.1:99999", False),
    Case("a file page", ("file://",), "127.0.0.1:8000", False),
    Case("no Host header: the server's address, as Django reads it", ("http://127.0.0.1:8000",), None, True),
    Case("no Host header, another port", ("http://127.0.0.1:8399",), None, False),
    Case(
        "a trusted origin on another port",
        ("http://localhost:8399",),
        "127.0.0.1:8000",
        True,
        settings={"CSRF_TRUSTED_ORIGINS": ["http://localhost:8399"]},
    ),
    Case(
        "a trusted origin's default port",
        ("https://localhost",),
        "127.0.0.1:8000",
        True,
        settings={"CSRF_TRUSTED_ORIGINS": ["https://localhost:443"]},
    ),
    Case(
        "next to a trusted origin",
        ("http://localhost:8400",),
        "127.0.0.1:8000",
        False,
        settings={"CSRF_TRUSTED_ORIGINS": ["http://localhost:8399"]},
    ),
    Case(
        "a trusted origin with another scheme",
        ("https://localhost:8399",),
        "127.0.0.1:8000",
        False,
        settings={"CSRF_TRUSTED_ORIGINS": ["http://localhost:8399"]},
    ),
    Case(
        "a trusted wildcard",
        ("https://team.cachet.example",),
        "127.0.0.1:8000",
        True,
        settings={"CSRF_TRUSTED_ORIGINS": ["https://*.cachet.example"]},
        loopback=False,
    ),
    Case(
        "a trusted wildcard, another port",
        ("https://team.cachet.example:8443",),
        "127.0.0.1:8000",
        False,
        settings={"CSRF_TRUSTED_ORIGINS": ["https://*.cachet.example"]},
        loopback=False,
    ),
    Case(
        "a trusted wildcard, a look-alike",
        ("https://evilcachet.example",),
        "127.0.0.1:8000",
        False,
        settings={"CSRF_TRUSTED_ORIGINS": ["https://*.cachet.example"]},
        loopback=False,
    ),
    Case(
        "a host outside ALLOWED_HOSTS",
        ("http://evil.example:8000",),
        "evil.example:8000",
        False,
        loopback=False,
    ),
    Case(
        "behind a TLS proxy",
        ("https://localhost",),
        "localhost",
        True,
        headers=(("x-forwarded-proto", "https"),),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY},
    ),
    Case(
        "X-Forwarded-Proto without the proxy setting",
        ("https://localhost",),
        "localhost",
        False,
        headers=(("x-forwarded-proto", "https"),),
    ),
    Case(
        "an http page behind a TLS proxy",
        ("http://localhost",),
        "localhost",
        False,
        headers=(("x-forwarded-proto", "https"),),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY},
    ),
    Case(
        "a proxy chain: the first X-Forwarded-Proto counts",
        ("https://localhost",),
        "localhost",
        True,
        headers=(("x-forwarded-proto", "https, http"),),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY},
    ),
    Case(
        "the proxy setting with plain http to the proxy",
        ("http://localhost",),
        "localhost",
        True,
        headers=(("x-forwarded-proto", "http"),),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY},
    ),
    Case(
        "X-Forwarded-Host with USE_X_FORWARDED_HOST",
        ("https://localhost:8443",),
        "127.0.0.1:8000",
        True,
        headers=(("x-forwarded-proto", "https"), ("x-forwarded-host", "localhost:8443")),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY, "USE_X_FORWARDED_HOST": True},
    ),
    Case(
        "X-Forwarded-Host without USE_X_FORWARDED_HOST",
        ("https://localhost:8443",),
        "127.0.0.1:8000",
        False,
        headers=(("x-forwarded-proto", "https"), ("x-forwarded-host", "localhost:8443")),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY},
    ),
    Case(
        "X-Forwarded-Host outside ALLOWED_HOSTS",
        ("https://evil.example",),
        "127.0.0.1:8000",
        False,
        headers=(("x-forwarded-proto", "https"), ("x-forwarded-host", "evil.example")),
        settings={"SECURE_PROXY_SSL_HEADER": PROXY, "USE_X_FORWARDED_HOST": True},
        loopback=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_origin_rule(case: Case) -> None:
    with override_settings(**case.overrides()):
        assert origin_allowed(case.scope()) is case.allowed


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_origin_rule_through_the_application(chat_session: ChatSession, user: Any) -> None:
    """Accepted cases reach the session (its hello is answered); refused ones are closed before accept,
    which Daphne answers with HTTP 403."""
    client = Client()
    await client.aforce_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    path = f"/ws/sessions/{chat_session.pk}/"
    wrong: list[str] = []
    for case in [case for case in CASES if case.loopback]:
        with override_settings(**case.overrides()):
            communicator = ApplicationCommunicator(application, case.scope(path, cookie))
            await communicator.send_input({"type": "websocket.connect"})
            first = await communicator.receive_output(timeout=5)
            accepted = first["type"] == "websocket.accept"
            assert accepted or first == {"type": "websocket.close"}, (case.name, first)
            if accepted:
                await communicator.send_input({"type": "websocket.receive", "text": '{"type": "hello", "rev": 0}'})
                answer = await communicator.receive_output(timeout=5)
                assert '"id":"controls"' in answer["text"], case.name
            await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
            await communicator.wait(timeout=5)
        if accepted is not case.allowed:
            wrong.append(f"{case.name}: {'accepted' if accepted else 'refused'}")
    assert wrong == []


@pytest.mark.asyncio
async def test_it_serves_websockets_only() -> None:
    from cachet.origins import ExactOriginValidator

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not reached")

    with pytest.raises(ValueError, match="websockets only"):
        await ExactOriginValidator(inner)({"type": "http"}, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("http://a.example", Origin("http", "a.example", 80)),
        ("https://a.example", Origin("https", "a.example", 443)),
        ("https://A.Example:8443", Origin("https", "a.example", 8443)),
        ("http://[::1]:8000", Origin("http", "::1", 8000)),
        (" http://a.example ", Origin("http", "a.example", 80)),
        ("ws://a.example", None),
        ("http://", None),
        ("http://a.example:", None),
        ("http://a.example:0", None),
        ("http://a.example:65536", None),
        ("http://a.example:8x", None),
        ("http://a.example:٣", None),
        ("http://[::1", None),
        ("http://::1:80", None),
        ("http://a.example?x", None),
        ("http://a.example#x", None),
        ("http://a b", None),
        ("http://*.a.example", None),
        ("a.example", None),
        ("null", None),
    ],
)
def test_parse_origin(text: str, parsed: Origin | None) -> None:
    assert parse_origin(text) == parsed


def test_parse_pattern_reads_wildcards_as_django_does() -> None:
    pattern = parse_pattern("https://*.cachet.example")
    assert pattern == OriginPattern("https", "cachet.example", 443, subdomains=True)
    assert pattern.matches(Origin("https", "cachet.example", 443))
    assert pattern.matches(Origin("https", "a.b.cachet.example", 443))
    assert not pattern.matches(Origin("https", "xcachet.example", 443))
    assert not pattern.matches(Origin("http", "a.cachet.example", 443))
    assert parse_pattern("https://*") is None
    assert parse_pattern("https://a.*.example") is None


def test_own_origin_is_read_as_django_reads_a_request() -> None:
    case = Case("", (), "localhost:8000", True, headers=(("x-forwarded-proto", "https"),))
    with override_settings(SECURE_PROXY_SSL_HEADER=None):
        assert own_origin(case.scope()) == Origin("http", "localhost", 8000)
    with override_settings(SECURE_PROXY_SSL_HEADER=PROXY):
        assert own_origin(case.scope()) == Origin("https", "localhost", 8000)
    assert own_origin(Case("", (), "localhost", True, scheme="wss").scope()) == Origin("https", "localhost", 443)
    assert own_origin(Case("", (), "localhost", True, scheme="gopher").scope()) is None
    assert str(Origin("http", "::1", 8000)) == "http://[::1]:8000"
