"""The websocket's messages: a form field's long value follows its element in pieces, each message under the limit."""

from __future__ import annotations

import json
from html import unescape

import pytest

from chat.web import fragments
from chat.web.messages import MESSAGE_LIMIT, TEXT_PIECE, pack


@pytest.mark.parametrize(
    "words",
    ["Short words", "<" * TEXT_PIECE, '"' * 199_000, "\x01" * 199_000, "😀" * 100_000, "a\ud800b" * 40_000],
)
def test_words_given_back_to_the_box_fit_the_messages_whatever_they_hold(words: str) -> None:
    messages = pack([fragments.composer_put(words), fragments.notice_put("Given back.")])
    assert all(len(message.encode("utf-8")) <= MESSAGE_LIMIT for message in messages)
    ops = [op for message in messages for op in json.loads(message)["ops"]]
    assert ops[0]["op"] == "put" and ops[0]["id"] == "composer-text" and ops[-1]["id"] == "notice"
    html = ops[0]["html"]
    pieces = [op["text"] for op in ops if op["op"] == "append"]
    assert all(op["id"] == "composer-text" for op in ops if op["op"] == "append")
    assert unescape(html[html.index(">") + 1 : html.rindex("</textarea>")]) + "".join(pieces) == words
    assert bool(pieces) == (len(words) > TEXT_PIECE)
