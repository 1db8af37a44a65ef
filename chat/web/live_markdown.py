"""Markdown of a step while it streams: each finished block is rendered once, only the unfinished tail again.

A top-level block is finished once a later block has started on a whole line: nothing the model writes after
that changes how it renders (a reference definition further down aside, which the step's final render honours).
So each render parses only the text from the first unfinished block on, and what goes to the page is the newly
finished blocks (appended) and the tail (replaced): the cost and the size of a piece follow the tail, not the
step. The tail's code is not highlighted (pygments costs about 10 ms per thousand characters; a finished block
is highlighted once, up to ``HIGHLIGHT_CHARS``). A tail longer than ``TAIL_CHARS`` is shown as its last
characters, plain, until its block finishes; past ``PARSE_CHARS`` of unfinished text no block is looked for
any more, and the step's final render shows it all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils.html import escape, format_html

from chat.web.messages import Put
from chat.web.rendering import block_starts, render_markdown

TAIL_CHARS = 8_000
HIGHLIGHT_CHARS = 16_000
PARSE_CHARS = 64_000
TAIL_ORDER = 1_000_000_000


@dataclass(frozen=True)
class LivePiece:
    """What changed on the page: the blocks that finished since the last piece (numbered), and the tail."""

    chunks: list[tuple[int, str]]
    tail: str


@dataclass
class LiveMarkdown:
    """The rendered state of one streaming step."""

    done_at: int = 0
    chunks: list[str] = field(default_factory=list)
    tail: str = ""
    rendered_length: int = 0

    def advance(self, text: str) -> LivePiece:
        """Render ``text`` (the step's text so far, which only grows) from the first unfinished block on."""
        fresh: list[tuple[int, str]] = []
        whole_lines = text.rfind("\n") + 1
        if self.done_at < whole_lines <= self.done_at + PARSE_CHARS:
            starts = block_starts(text[self.done_at : whole_lines])
            if len(starts) > 1:
                finished_at = self.done_at + starts[-1]
                chunk = text[self.done_at : finished_at]
                fresh.append((len(self.chunks), render_markdown(chunk, highlight=len(chunk) <= HIGHLIGHT_CHARS)))
                self.chunks.append(fresh[-1][1])
                self.done_at = finished_at
        self.tail = tail_html(text[self.done_at :])
        self.rendered_length = len(text)
        return LivePiece(fresh, self.tail)


def tail_html(tail: str) -> str:
    if len(tail) <= TAIL_CHARS:
        return render_markdown(tail, highlight=False)
    return f'<pre class="md-tail-raw">…{escape(tail[-TAIL_CHARS:])}</pre>'


def container_id(turn: int) -> str:
    return f"render-{turn}"


def container_put(turn: int) -> Put:
    """The rendered view of the turn's streaming step, empty: the page shows the raw text until it fills."""
    dom_id = container_id(turn)
    return Put(dom_id, format_html('<div class="md stream-md" id="{}" hx-disable></div>', dom_id))


def snapshot_puts(turn: int, state: LiveMarkdown) -> list[Put]:
    """The rendered view whole, for a tab that comes late: emptied, then each block, then the tail."""
    if not (state.chunks or state.tail):
        return [container_put(turn)]
    return [container_put(turn), *piece_puts(turn, LivePiece(list(enumerate(state.chunks)), state.tail))]


def piece_puts(turn: int, piece: LivePiece) -> list[Put]:
    """The page changes for ``piece``: its finished blocks go in by their order, its tail takes the old one's place."""
    into = container_id(turn)
    puts = [
        Put(f"{into}-{index}", _chunk(turn, index, html), into=into, at="order", lazy=_chunk(turn, index, "…"))
        for index, html in piece.chunks
    ]
    puts.append(Put(f"{into}-tail", _tail(turn, piece.tail), into=into, at="order", lazy=_tail(turn, "…")))
    return puts


def _chunk(turn: int, index: int, html: str) -> str:
    return f'<div id="{container_id(turn)}-{index}" class="md-chunk" data-order="{index}">{html}</div>'


def _tail(turn: int, html: str) -> str:
    return f'<div id="{container_id(turn)}-tail" class="md-chunk md-tail" data-order="{TAIL_ORDER}">{html}</div>'
