"""Decoding a ``text/event-stream`` body into its events.

httpx-sse was weighed and not taken: it reads the body through httpx's line decoder, which replaces bytes that
are not UTF-8 where this decoder refuses them (a protocol error, not silently changed text), and it joins
consecutive ``data:`` lines into one event where some servers omit the blank line between two complete events.
Keep-alive comments are skipped, and the ``[DONE]`` sentinel is an event like any other, for the caller.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class SSEEvent:
    """One event: its type (``message`` unless named) and its data lines joined."""

    event: str
    data: str


class SSEDecoder:
    """Incremental decoder of a `text/event-stream` body.

    Accepts LF, CRLF and CR line ends, lines and UTF-8 sequences split across chunks, comments,
    multi-line data, and servers that omit the blank line between two complete `data:` lines.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode `chunk` and return the events it completes."""
        self._buffer += self._utf8.decode(chunk)
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """Flush what is left at the end of the body, a last unterminated event included."""
        self._buffer += self._utf8.decode(b"", final=True)
        events = self._drain(final=True)
        if self._buffer:
            events.extend(self._line(self._buffer))
            self._buffer = ""
        events.extend(self._dispatch())
        return events

    def _drain(self, *, final: bool) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        start = 0
        buf = self._buffer
        while True:
            cr = buf.find("\r", start)
            lf = buf.find("\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr == len(buf) - 1 and not final:
                    break
                end = cr + 2 if buf.startswith("\n", cr + 1) else cr + 1
                line = buf[start:cr]
            else:
                end = lf + 1
                line = buf[start:lf]
            events.extend(self._line(line))
            start = end
        self._buffer = buf[start:]
        return events

    def _line(self, line: str) -> list[SSEEvent]:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return []
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            events = self._dispatch() if self._data and _complete_payload("\n".join(self._data)) else []
            self._data.append(value)
            return events
        if name == "event":
            self._event = value
        return []

    def _dispatch(self) -> list[SSEEvent]:
        if not self._data:
            self._event = ""
            return []
        event = SSEEvent(self._event or "message", "\n".join(self._data))
        self._data = []
        self._event = ""
        return [event]


def _complete_payload(data: str) -> bool:
    if data.strip() == "[DONE]":
        return True
    try:
        json.loads(data)
    except ValueError:
        return False
    return True
