"""Request bodies refused inside Daphne, before they are read.

Under Daphne, Twisted reads a request's whole body (into memory, or a temporary file past 100 kB) before the
application sees any of it, and Daphne then queues all of it at once: a 1 GB POST cost a 1 GB file and 1.1 GB of
memory, kept afterwards. :class:`LimitedRequest` refuses a body over its :func:`cachet.body_limits.body_limit` (by
its address and whether its cookies show a login, decided without the database) as soon as the headers give its
length, or, sent in chunks, as soon as what arrived passes the limit: a 413 with one line, and the connection closed
without reading the rest.
"""

from __future__ import annotations

from typing import IO, Any
from urllib.parse import unquote

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.web.http import HTTPChannel

from cachet.body_limits import Limit, body_limit

STATUS_LINE = b"HTTP/1.1 413 Content Too Large\r\n"


def request_path(channel: HTTPChannel) -> str:
    """The path of the request whose headers ``channel`` has read, decoded as Daphne decodes it.

    Twisted gives a request its address only once the whole body is in; its channel keeps the request line from
    the first line on, as ``_path`` (Twisted 26.10; a test serves an import larger than the forms' limit through
    it, which a missing ``_path`` would refuse).
    """
    target = getattr(channel, "_path", b"")
    try:
        return unquote(target.split(b"?", 1)[0].decode("ascii")) if isinstance(target, bytes) else ""
    except UnicodeDecodeError:
        return ""


class LimitedRequest(WebRequest):  # type: ignore[misc]
    """Daphne's request, which refuses a body past its limit before reading it."""

    content: IO[bytes] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Daphne never reads the form Twisted parses out of a POST's body, a copy of the whole body in memory.
        kwargs.setdefault("parsePOSTFormSubmission", False)
        super().__init__(*args, **kwargs)
        self.body_limit: Limit | None = None
        self.body_received = 0
        self.refused = False

    def gotLength(self, length: int | None) -> None:
        headers = [(name, value) for name, values in self.requestHeaders.getAllRawHeaders() for value in values]
        self.body_limit = body_limit(request_path(self.channel), headers)
        if length is not None and length > self.body_limit.size:
            self._refuse(self.body_limit)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self.body_received += len(data)
        if self.body_limit is not None and self.body_received > self.body_limit.size:
            self._refuse(self.body_limit)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self.refused:
            super().requestReceived(command, path, version)

    def _refuse(self, limit: Limit) -> None:
        self.refused = True
        if self.content is not None:
            self.content.close()
            self.content = None
        self.requestHeaders.removeHeader(b"Expect")  # the client asked whether to send: the answer is no
        headers, body = limit.answer()
        head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        self.channel.transport.write(STATUS_LINE + head + b"\r\n" + body)
        self.channel.loseConnection()


class LimitedHTTPFactory(HTTPFactory):  # type: ignore[misc]
    """Daphne's HTTP factory, making :class:`LimitedRequest` requests."""

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LimitedRequest
        return protocol
