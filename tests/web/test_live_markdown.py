"""A streaming step's markdown, rendered block by block: finished blocks once, the tail again each time."""

from __future__ import annotations

import json

import pytest

from chat.web.live_markdown import (
    PARSE_CHARS,
    TAIL_CHARS,
    LiveMarkdown,
    LivePiece,
    container_put,
    piece_puts,
    snapshot_puts,
)
from chat.web.messages import MESSAGE_LIMIT, pack
from chat.web.rendering import block_starts, render_markdown

DOCUMENT = (
    "# Counting\n\nThe notes have **30** lines\nand *two* parts.\n\n- one\n- two\n\n  still two\n\n"
    "1. first\n2. second\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\nplain <code>\n\nwith a blank line\n```\n"
    "$$\nE = mc^2\n$$\n> quoted\nlazily\n\nSo $x^2$ it is.\nDone."
)


def streamed(text: str, sizes: tuple[int, ...]) -> tuple[LiveMarkdown, list[LivePiece]]:
    live, pieces, at, turn = LiveMarkdown(), [], 0, 0
    while at < len(text):
        at = min(len(text), at + sizes[turn % len(sizes)])
        turn += 1
        pieces.append(live.advance(text[:at]))
    return live, pieces


@pytest.mark.parametrize("sizes", [(1,), (3, 7, 2), (40,), (len(DOCUMENT),)])
def test_the_finished_blocks_and_the_tail_render_as_the_whole_text_does(sizes: tuple[int, ...]) -> None:
    live, pieces = streamed(DOCUMENT, sizes)
    assert "".join(live.chunks) + live.tail == render_markdown(DOCUMENT)
    numbered = [index for piece in pieces for index, _ in piece.chunks]
    assert numbered == list(range(len(live.chunks))), "each finished block is sent once, in order"


def test_a_block_is_finished_only_once_the_next_one_starts_on_a_whole_line() -> None:
    live = LiveMarkdown()
    assert live.advance("**Bold** start\n\nnext").chunks == []
    piece = live.advance("**Bold** start\n\nnext line\n")
    assert piece.chunks == [(0, "<p><strong>Bold</strong> start</p>\n")]
    assert piece.tail == "<p>next line</p>\n"
    assert live.done_at == len("**Bold** start\n\n")


def test_a_tail_renders_as_it_streams_with_unfinished_markup_as_text() -> None:
    live = LiveMarkdown()
    assert live.advance("It is **bo").tail == "<p>It is **bo</p>\n"
    assert live.advance("It is **bold**").tail == "<p>It is <strong>bold</strong></p>\n"
    code = live.advance("It is **bold**\n\n```python\ndef f():\n    return 1")
    assert "<pre><code>def f():\n    return 1</code></pre>" in code.tail
    assert '<span class="k">' not in code.tail, "an unfinished code block is not highlighted"
    finished = live.advance("It is **bold**\n\n```python\ndef f():\n    return 1\n```\nAfter.\n")
    assert any('<span class="k">def</span>' in html for _, html in finished.chunks)


def test_a_long_tail_shows_its_end_as_plain_text() -> None:
    live = LiveMarkdown()
    text = "<b>" + "x" * (TAIL_CHARS + 100) + " end"
    piece = live.advance(text)
    assert piece.tail.startswith('<pre class="md-tail-raw">…')
    assert piece.tail.endswith(" end</pre>") and "<b>" not in piece.tail
    assert len(piece.tail) < TAIL_CHARS + 100


def test_past_the_parse_limit_no_block_is_looked_for() -> None:
    live = LiveMarkdown()
    text = "line\n" * (PARSE_CHARS // 5 + 10) + "\n\nafter\n"
    piece = live.advance(text)
    assert piece.chunks == [] and live.done_at == 0
    assert piece.tail.startswith('<pre class="md-tail-raw">')


def test_block_starts_are_character_offsets() -> None:
    text = "a\nb\n\n- c\n\n  still c\n\n> q\n"
    assert [text[at : at + 3] for at in block_starts(text)] == ["a\nb", "- c", "> q"]


def test_the_page_changes_append_finished_blocks_and_replace_the_tail() -> None:
    live = LiveMarkdown()
    live.advance("One.\n\nTwo.\n")
    piece = live.advance("One.\n\nTwo.\n\nThree\n")
    puts = piece_puts(7, piece)
    assert [(put.id, put.into, put.at) for put in puts] == [
        ("render-7-1", "render-7", "order"),
        ("render-7-tail", "render-7", "order"),
    ]
    assert puts[0].html == '<div id="render-7-1" class="md-chunk" data-order="1"><p>Two.</p>\n</div>'
    assert 'data-order="1000000000"><p>Three</p>' in puts[1].html
    empty = '<div class="md stream-md" id="render-7" hx-disable></div>'
    assert container_put(7).html == empty
    snapshot = snapshot_puts(7, live)
    assert [put.id for put in snapshot] == ["render-7", "render-7-0", "render-7-1", "render-7-tail"]
    assert snapshot[0].html == empty and "<p>One.</p>" in snapshot[1].html
    assert [put.id for put in snapshot_puts(7, LiveMarkdown())] == ["render-7"]


def test_every_message_stays_under_the_limit() -> None:
    code = "```python\n" + "".join(f"value_{n} = compute({n}, 'text')  # note\n" for n in range(6000)) + "```\n\nEnd.\n"
    live, pieces = streamed(code, (20_000,))
    for piece in pieces:
        for message in pack(piece_puts(1, piece)):
            assert len(message.encode()) <= MESSAGE_LIMIT
            json.loads(message)
    for message in pack(snapshot_puts(1, live)):
        assert len(message.encode()) <= MESSAGE_LIMIT
