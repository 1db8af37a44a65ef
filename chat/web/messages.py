"""The messages the websocket sends a chat page: JSON, each at most ``MESSAGE_LIMIT`` bytes.

A message may carry ``rev`` (the session revision it brings the page to), ``ops`` (changes to the page:
put an element in place by its id, remove one, or append text to a form field's value), ``live`` (text of
the step being streamed, with its offset, so a page that already has it drops it) and ``hello`` (true: say hello
again, as when the socket opens, since what the page was sent meanwhile may be lost). ``static/cachet/chat.js``
applies them.

Whatever a session holds, no message is larger than the limit: ops are packed into as many messages as
they need, an element too large for one message is sent as a placeholder that loads itself over HTTP,
a form field's long value follows its element in pieces, and streamed text is cut into pieces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypedDict

MESSAGE_LIMIT = 256 * 1024
TEXT_PIECE = 32 * 1024
_ENVELOPE = 256


class OpData(TypedDict, total=False):
    op: Literal["put", "remove", "append"]
    id: str
    html: str
    text: str
    into: str
    at: Literal["end", "start", "order"]


class LiveData(TypedDict, total=False):
    turn: int
    step: int
    reset: bool
    text: str
    text_at: int
    reasoning: str
    reasoning_at: int
    calls: list[str]


@dataclass(frozen=True)
class Put:
    """Put ``html`` (one element whose id is ``id``) in place of the element with that id; where there is
    none, into the element ``into``: at its end, its start, or by the elements' ``data-order``. ``value`` (of a
    form field) follows the element as text, in pieces of ``TEXT_PIECE``: as HTML it might not fit a message."""

    id: str
    html: str
    into: str = ""
    at: Literal["end", "start", "order"] = "end"
    lazy: str = ""
    value: str = ""

    def data(self) -> OpData:
        op: OpData = {"op": "put", "id": self.id, "html": self.html}
        if self.into:
            op["into"] = self.into
            op["at"] = self.at
        return op


@dataclass(frozen=True)
class Remove:
    """Remove the element ``id`` where the page has it."""

    id: str

    def data(self) -> OpData:
        return {"op": "remove", "id": self.id}


Op = Put | Remove


@dataclass
class Message:
    rev: int | None = None
    ops: list[OpData] = field(default_factory=list)
    live: LiveData | None = None
    hello: bool = False

    def encode(self) -> str:
        data: dict[str, object] = {}
        if self.rev is not None:
            data["rev"] = self.rev
        if self.ops:
            data["ops"] = self.ops
        if self.live is not None:
            data["live"] = self.live
        if self.hello:
            data["hello"] = True
        return dumps(data)


_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(data: object) -> str:
    """JSON as UTF-8 can carry it: a lone surrogate (half of a character split between two streamed pieces)
    is written as its escape, which the page joins with the other half."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def utf16_length(text: str) -> int:
    """The length of ``text`` as a browser counts it (UTF-16 code units)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _size(data: object) -> int:
    return len(dumps(data).encode("utf-8"))


def _fitting(op: Op, limit: int) -> OpData:
    data = op.data()
    if _size(data) + _ENVELOPE <= limit:
        return data
    if isinstance(op, Put) and op.lazy:
        return Put(op.id, op.lazy, op.into, op.at).data()
    raise ValueError(f"the element {op.id} is larger than a message and has no placeholder")


def _sent(op: Op, limit: int) -> Iterator[OpData]:
    yield _fitting(op, limit)
    value = op.value if isinstance(op, Put) else ""
    while value:
        piece, value = _split(value)
        yield {"op": "append", "id": op.id, "text": piece}


def pack(ops: Iterable[Op], *, rev: int | None = None, limit: int = MESSAGE_LIMIT) -> list[str]:
    """``ops`` as messages of at most ``limit`` bytes each, in order; the last one carries ``rev``."""
    messages: list[Message] = []
    current = Message()
    size = _ENVELOPE
    for op in ops:
        for data in _sent(op, limit):
            op_size = _size(data) + 1
            if current.ops and size + op_size > limit:
                messages.append(current)
                current, size = Message(), _ENVELOPE
            current.ops.append(data)
            size += op_size
    if current.ops or rev is not None:
        messages.append(current)
    if messages:
        messages[-1].rev = rev
    return [message.encode() for message in messages]


def live_messages(
    *,
    turn: int,
    step: int,
    text: str = "",
    text_at: int = 0,
    reasoning: str = "",
    reasoning_at: int = 0,
    calls: Iterable[str] = (),
    reset: bool = False,
) -> Iterator[str]:
    """The streamed text of a step as messages, long texts in pieces (offsets in UTF-16 units)."""
    names = list(calls)
    first = True
    while first or text or reasoning:
        live: LiveData = {"turn": turn, "step": step}
        if reset and first:
            live["reset"] = True
        if first and names:
            live["calls"] = names
        text_piece, text = _split(text)
        reasoning_piece, reasoning = _split(reasoning)
        if text_piece:
            live["text"], live["text_at"] = text_piece, text_at
            text_at += utf16_length(text_piece)
        if reasoning_piece:
            live["reasoning"], live["reasoning_at"] = reasoning_piece, reasoning_at
            reasoning_at += utf16_length(reasoning_piece)
        first = False
        yield Message(live=live).encode()


def _split(text: str) -> tuple[str, str]:
    if len(text) <= TEXT_PIECE:
        return text, ""
    cut = TEXT_PIECE
    if "\ud800" <= text[cut - 1] <= "\udbff":
        cut -= 1
    return text[:cut], text[cut:]
