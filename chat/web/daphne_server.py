"""Daphne as Cachet serves it (``manage.py serve`` and the browser tests). Importing this module installs Twisted's
asyncio reactor, as importing ``daphne.server`` does: import it only to serve.

Daphne alone reads websocket frames up to 1 MiB and drops the TCP connection, with no close frame, at a larger
one, so the page can only reconnect without knowing why. Here frames and messages up to
``CACHET_MAX_FRAME_BYTES`` (4 MiB by default) reach the consumer, which answers one over
``CACHET_MAX_MESSAGE_BYTES`` with a notice and puts its words back in the box; a larger one is closed with
1009 (message too big) and a reason, which the page shows as a notice before it connects again.
"""

from __future__ import annotations

import logging
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.server import Server
from django.conf import settings

from chat.web.daphne_bodies import LimitedHTTPFactory


class CachetServer(Server):  # type: ignore[misc]
    """Daphne with Cachet's websocket limits, and a close frame rather than a dropped connection past them; request
    bodies past their limits refused before they are read (:mod:`chat.web.daphne_bodies`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("websocket_max_message_size", settings.CACHET_MAX_FRAME_BYTES)
        kwargs.setdefault("websocket_max_frame_size", settings.CACHET_MAX_FRAME_BYTES)
        super().__init__(*args, **kwargs)

    # ``Server.run`` makes its websocket factory and sets the limits on it: the factory is set up here as it is
    # assigned, before any connection is accepted.
    @property
    def ws_factory(self) -> Any:
        return self._cachet_ws_factory

    @ws_factory.setter
    def ws_factory(self, factory: Any) -> None:
        factory.setProtocolOptions(failByDrop=False)
        self._cachet_ws_factory = factory

    # ``Server.run`` makes Daphne's HTTP factory as it starts: Cachet's, the same but for its requests, takes its
    # place before any connection is accepted.
    @property
    def http_factory(self) -> Any:
        return self._cachet_http_factory

    @http_factory.setter
    def http_factory(self, factory: Any) -> None:
        self._cachet_http_factory = LimitedHTTPFactory(factory.server)


class _CommandLine(CommandLineInterface):  # type: ignore[misc]
    server_class = CachetServer


def _not_about_http2(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("HTTP/2 support")


def serve(*, host: str, port: int, application: str = "cachet.asgi:application") -> None:
    """Serve ``application`` on ``host``:``port`` until stopped."""
    logging.getLogger("daphne.server").addFilter(_not_about_http2)  # Cachet serves HTTP/1.1 behind Caddy's HTTP/2
    limit = str(settings.CACHET_MAX_FRAME_BYTES)
    _CommandLine().run(
        [
            *("-b", host, "-p", str(port)),
            *("--websocket-max-message-size", limit, "--websocket-max-frame-size", limit),
            application,
        ]
    )
