"""Which pages may open Cachet's websockets: exactly the origins (scheme, host and port) Cachet serves.

Channels' ``AllowedHostsOriginValidator`` compares host names only, and a login cookie is sent to every port
of a host, so a page served from another port of the same host could otherwise talk as the person logged in.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest

from cachet.asgi_types import ASGIApp, Receive, Scope, Send

Application = ASGIApp

DEFAULT_PORTS = {"http": 80, "https": 443}
HTTP_SCHEME_OF = {"ws": "http", "wss": "https"}

logger = logging.getLogger("cachet.security")


@dataclass(frozen=True)
class Origin:
    """A web origin with its port made explicit: ``http://host`` is ``Origin("http", "host", 80)``."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class OriginPattern:
    """A ``CSRF_TRUSTED_ORIGINS`` entry: an origin, or with ``*.`` a domain and its subdomains, as Django reads it."""

    scheme: str
    host: str
    port: int
    subdomains: bool

    def matches(self, origin: Origin) -> bool:
        if (origin.scheme, origin.port) != (self.scheme, self.port):
            return False
        if not self.subdomains:
            return origin.host == self.host
        return origin.host == self.host or origin.host.endswith("." + self.host)


def parse_origin(text: str) -> Origin | None:
    """``scheme://host[:port]`` with scheme http or https and nothing else, else ``None`` (``null`` included)."""
    pattern = parse_pattern(text)
    if pattern is None or pattern.subdomains:
        return None
    return Origin(pattern.scheme, pattern.host, pattern.port)


def parse_pattern(text: str) -> OriginPattern | None:
    scheme, separator, authority = text.strip().partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in DEFAULT_PORTS or not authority:
        return None
    if any(mark in authority for mark in "/?#@\\ "):
        return None
    if authority.startswith("["):
        host, bracket, rest = authority[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_found = authority.partition(":")
        port_text = port_text_found if colon else None
        if not host or ":" in port_text_found:
            return None
    if port_text is None:
        port = DEFAULT_PORTS[scheme]
    elif port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        return None
    host = host.lower()
    subdomains = host.startswith("*.")
    if subdomains:
        host = host[2:]
    if not host or "*" in host:
        return None
    return OriginPattern(scheme, host, port, subdomains)


def request_origin(scope: Scope) -> Origin | None:
    """The handshake's one ``Origin`` header, parsed; ``None`` when it is missing, repeated or not an origin."""
    values = [value for name, value in scope.get("headers", []) if name.lower() == b"origin"]
    if len(values) != 1:
        return None
    return parse_origin(values[0].decode("latin1"))


def _http_request(scope: Scope) -> HttpRequest | None:
    scheme = HTTP_SCHEME_OF.get(scope.get("scheme") or "ws")
    if scheme is None:
        return None
    return ASGIRequest({**scope, "type": "http", "method": "GET", "scheme": scheme}, io.BytesIO())


def own_origin(scope: Scope) -> Origin | None:
    """The origin the handshake was addressed to, read as Django reads a request: ``request.scheme`` (which
    honours ``SECURE_PROXY_SSL_HEADER`` where set) and ``request.get_host()`` (``X-Forwarded-Host`` only with
    ``USE_X_FORWARDED_HOST``; a host outside ``ALLOWED_HOSTS`` gives ``None``)."""
    request = _http_request(scope)
    if request is None:
        return None
    try:
        host = request.get_host()
    except DisallowedHost:
        return None
    return parse_origin(f"{request.scheme}://{host}")


def trusted_patterns(entries: Iterable[str]) -> list[OriginPattern]:
    return [pattern for pattern in map(parse_pattern, entries) if pattern is not None]


def origin_allowed(scope: Scope) -> bool:
    """Whether the handshake comes from the origin it is addressed to or from one of ``CSRF_TRUSTED_ORIGINS``."""
    origin = request_origin(scope)
    if origin is None:
        return False
    if origin == own_origin(scope):
        return True
    return any(pattern.matches(origin) for pattern in trusted_patterns(settings.CSRF_TRUSTED_ORIGINS))


class ExactOriginValidator:
    """ASGI middleware for websockets: refuses the handshake (HTTP 403, before accept) unless
    :func:`origin_allowed`."""

    def __init__(self, application: Application) -> None:
        self.application = application
        self.deny: Application = WebsocketDenier.as_asgi()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            raise ValueError(f"ExactOriginValidator serves websockets only, not {scope['type']!r}")
        if origin_allowed(scope):
            await self.application(scope, receive, send)
            return
        origins = [value.decode("latin1") for name, value in scope.get("headers", []) if name.lower() == b"origin"]
        logger.warning("Refused a websocket to %s from origin %s", scope.get("path", ""), origins or "(none)")
        await self.deny(scope, receive, send)
