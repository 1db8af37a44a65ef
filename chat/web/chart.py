"""The cache-hit chart: one bar per model request of a session, each its own small SVG, so a new
request appends a bar and the chart is never sent again whole.

The scale is fixed for a session's model: a bar's height is its prompt tokens as a share of the model's
context window (cached tokens dark, the rest light), and the time to first token is a line on a fixed
logarithmic scale (each bar draws the segment from the bar before). A request whose prefix broke is
marked above its bar with the cause. Every bar carries its figures (``data-figures``: the card shown on hover,
focus or tap), and, where the server's
template and tokenizer could be asked, the tokens expected cached and a shortfall's class (harness,
template, server) with the tokens lost. No script and no inline
styles: presentation attributes and classes only, so the page's content security policy holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from sessions_app.models import STOPPED, BreakCause, ModelRequest, Moved, RequestKind, RequestStatus, Turn
from sessions_app.selectors.totals import RequestTotals

HEIGHT = 100.0
WIDTH = 20.0
TTFT_FLOOR = 0.01
TTFT_DECADES = 4
SHOWN_BARS = 120
TITLE = str(RequestKind.TITLE.value)  # a title's request is marked as its own cause: it breaks nothing
TITLE_WORD = "title (the model names the session)"
MIN_BAR = 3.0  # the least height of a bar with a prompt, in % of the plot: a small prompt still shows


@dataclass(frozen=True)
class Bar:
    """One finished request's figures, as the chart shows them."""

    index: int
    request: ModelRequest
    previous_ttft: float | None

    @property
    def prompt(self) -> int:
        return self.request.prompt_tokens or 0

    @property
    def cached(self) -> int:
        return min(self.request.cached_tokens or 0, self.prompt)

    @property
    def uncached(self) -> int:
        return self.prompt - self.cached

    @property
    def cause_label(self) -> str:
        if self.request.kind == RequestKind.TITLE:
            return TITLE_WORD
        cause = self.request.break_cause
        return _cause_labels().get(cause, cause)

    @property
    def marker(self) -> str:
        """What is marked above the bar: why the prefix broke, else why the request went elsewhere ("replica",
        "slot": the server's cache of the session was left behind)."""
        if self.request.kind == RequestKind.TITLE:
            return TITLE
        return self.request.break_cause or self.request.moved

    @property
    def miss_label(self) -> str:
        """The class of a cache shortfall with the tokens lost (and, for a template, the message), or "none"."""
        request = self.request
        if not request.cache_miss:
            return "none"
        label = f"{request.cache_miss}, {_figure(request.cache_miss_tokens)} tokens lost"
        if request.cache_miss_message is not None:
            label += f" from message {request.cache_miss_message}"
        return label

    def short_label(self) -> str:
        """The bar in one line, for a screen reader: its number, prompt and what was cached."""
        request = self.request
        cached = f"{self.cached:,} cached" if request.cached_tokens is not None else "cache not reported"
        prompt = f"{self.prompt:,} prompt tokens, {cached}" if request.prompt_tokens is not None else "no usage"
        cause = f", {self.cause_label or request.moved}" if self.marker else ""
        return f"Request {self.index}: {prompt}{cause}. Show its figures."

    def tooltip(self) -> str:
        request = self.request
        lines = [
            f"Request {self.index} · {request.kind}"
            + (_turn_label(request.turn) if request.turn is not None else "")
            + (f" · step {request.step_number}" if request.step_number else ""),
            f"prompt tokens: {_figure(request.prompt_tokens)}",
            "cached tokens: "
            + (_figure(request.cached_tokens) if request.cached_tokens is not None else "not reported"),
            f"uncached tokens: {_figure(self.uncached) if request.prompt_tokens is not None else '—'}",
            f"completion tokens: {_figure(request.completion_tokens)}",
            f"time to first token: {_seconds(request.time_to_first_token)}",
            f"total time: {_seconds(request.total_time)}",
            f"bytes sent: {_figure(request.bytes_sent)}",
            f"bytes shared with the request before: {_figure(request.shared_prefix_bytes)}",
            f"prefix break: {_cause_labels().get(request.break_cause, request.break_cause) or 'none'}",
            f"sent to: {request.endpoint_url}" + (f", slot {request.slot}" if request.slot is not None else ""),
        ]
        if request.moved:
            lines.append(f"moved: {request.moved}")
        if request.expected_cached_tokens is not None:
            lines.append(f"expected cached: {_figure(request.expected_cached_tokens)}")
            lines.append(f"cache miss: {self.miss_label}")
        else:
            lines.append("cache miss: not checked (the server offers no template and tokenizer to check with)")
        if stopped(request):
            lines.append("stopped: the person stopped the reply")
        elif request.status == RequestStatus.FAILED:
            lines.append(f"failed: {request.error}")
        return "\n".join(lines)


def stopped(request: ModelRequest) -> bool:
    """Whether the request ended because the person stopped its reply (stored as failed, with ``Stopped.``)."""
    return request.status == RequestStatus.FAILED and request.error == STOPPED


@functools.cache
def _cause_labels() -> dict[str, str]:
    return {str(cause.value): str(cause.label) for cause in BreakCause}


# What is marked above a bar, one character that reads horizontally in a 16-pixel bar; the word is on hover and
# in the legend.
CAUSE_MARKS: dict[str, str] = {
    BreakCause.FIRST: "1",
    BreakCause.NEW_TURN: "T",
    BreakCause.UNDO: "U",
    BreakCause.REWIND: "W",
    BreakCause.REGENERATE: "G",
    BreakCause.BRANCH: "B",
    BreakCause.COMPACTION: "C",
    BreakCause.MODEL_CHANGE: "M",
    BreakCause.RESTART: "R",
    BreakCause.UNEXPECTED: "!",
    Moved.REPLICA: "P",
    Moved.SLOT: "S",
    TITLE: "N",
}


def _legend_marks() -> SafeString:
    words = {**_cause_labels(), **{str(moved.value): str(moved.label) for moved in Moved}, TITLE: "title"}
    return format_html_join(
        " ",
        '<span class="mark cause-{}">{}</span> {}',
        ((cause, mark, words[cause]) for cause, mark in CAUSE_MARKS.items()),
    )


def _figure(value: int | None) -> str:
    """A count as a person reads it: ``12,345``."""
    return "—" if value is None else f"{value:,}"


def _plain(value: int | None) -> str:
    """A count as a script reads it, in a data attribute: ``12345``."""
    return "—" if value is None else str(value)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def ttft_y(seconds: float) -> float:
    """Where a time to first token sits: 0.01 s at the bottom, each tenfold a quarter higher, 100 s on top."""
    decades = math.log10(max(seconds, TTFT_FLOOR) / TTFT_FLOOR)
    return HEIGHT - HEIGHT * min(decades, TTFT_DECADES) / TTFT_DECADES


def bars_of(requests: Sequence[ModelRequest], *, first_index: int = 1, ttft_before: float | None = None) -> list[Bar]:
    """The finished requests as bars, numbered from ``first_index`` in the order they were sent."""
    bars: list[Bar] = []
    previous = ttft_before
    for request in requests:
        if request.status == RequestStatus.SENDING:
            continue
        bars.append(Bar(first_index + len(bars), request, previous))
        if request.time_to_first_token is not None:
            previous = request.time_to_first_token
    return bars


def _share(tokens: int, window: int) -> float:
    return HEIGHT * min(tokens, window) / window if window else 0.0


_NO_CAUSE = '<span class="cause"></span>'


def bar_html(bar: Bar, *, window: int, auto_at: float) -> SafeString:
    """One bar: the tokens stacked as a share of ``window``, the time-to-first-token segment, the cause.

    Built with f-strings, escaping the texts and nothing else (the rest are numbers): a page draws 120 bars,
    and ``format_html`` per part cost three times as much."""
    request = bar.request
    tooltip = escape(bar.tooltip())
    cause = escape(bar.marker)
    threshold = f"{HEIGHT * (1 - auto_at):.2f}"
    parts: list[str] = [
        f'<svg class="bar-svg" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" overflow="visible" '
        f'aria-hidden="true"><g class="bar" data-request="{request.pk}" data-prompt="{_plain(request.prompt_tokens)}"'
        f' data-cached="{_plain(request.cached_tokens)}" data-cause="{cause}" '
        f'data-miss="{escape(request.cache_miss)}">'
        f'<rect class="hit" x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill-opacity="0"/>',
        f'<line class="threshold" x1="0" x2="{WIDTH}" y1="{threshold}" y2="{threshold}" '
        'vector-effect="non-scaling-stroke"/>',
    ]
    if request.prompt_tokens is not None:
        known = request.cached_tokens is not None
        prompt_height = max(_share(bar.prompt, window), MIN_BAR if bar.prompt else 0.0)  # no sliver of a bar
        cached_height = prompt_height * bar.cached / bar.prompt if bar.prompt else 0.0
        cached_top = HEIGHT - cached_height
        prompt_top = HEIGHT - prompt_height
        parts.append(
            f'<rect class="{"cached" if known else "unknown"}" x="3" y="{cached_top:.2f}" width="14" '
            f'height="{HEIGHT - cached_top:.2f}"/><rect class="{"uncached" if known else "unknown"}" x="3" '
            f'y="{prompt_top:.2f}" width="14" height="{cached_top - prompt_top:.2f}"/>'
        )
    if request.status == RequestStatus.FAILED:
        ended = "stopped" if stopped(request) else "failed"  # a Stop is the person's, not a fault: not red
        parts.append(f'<rect class="{ended}" x="3" y="{HEIGHT - 2}" width="14" height="2"/>')
    if request.time_to_first_token is not None:
        y = f"{ttft_y(request.time_to_first_token):.2f}"
        if bar.previous_ttft is not None:
            parts.append(
                f'<line class="ttft" x1="{-WIDTH / 2}" y1="{ttft_y(bar.previous_ttft):.2f}" x2="{WIDTH / 2}" '
                f'y2="{y}" vector-effect="non-scaling-stroke"/>'
            )
        parts.append(
            f'<line class="ttft-dot" x1="{WIDTH / 2}" y1="{y}" x2="{WIDTH / 2 + 0.01}" y2="{y}" '
            'vector-effect="non-scaling-stroke"/>'
        )
    parts.append("</g></svg>")
    word = bar.cause_label if request.break_cause or request.kind == RequestKind.TITLE else request.moved
    mark = CAUSE_MARKS.get(bar.marker, "?")
    label = (
        f'<span class="cause cause-{cause}" title="{escape(word)}" aria-label="{escape(word)}">{mark}</span>'
        if cause
        else _NO_CAUSE
    )
    name = escape(bar.short_label())
    return mark_safe(  # every text above is escaped
        f'<div class="chart-bar" id="bar-{request.pk}" data-order="{request.pk}" data-figures="{tooltip}" '
        f'tabindex="0" role="button" aria-label="{name}">{label}'
        f'{"".join(parts)}<span class="n" aria-hidden="true">{bar.index}</span></div>'
    )


def chart_html(bars: Sequence[Bar], *, window: int, auto_at: float, more: int = 0, full_url: str = "") -> SafeString:
    """The whole chart: its axes, the bars given and, where ``more`` earlier bars are left out, a link."""
    threshold = round(auto_at * 20) * 5  # the axis places labels every 5 %
    ticks = format_html_join(
        "",
        '<span class="tick{}" data-at="{}">{}</span>',
        (
            ("", 100, "100 %"),
            (" threshold-tick", threshold, f"compacts at {round(auto_at * 100)} %"),
            ("", 50, "50 %"),
            ("", 25, "25 %"),
            ("", 0, "0 %"),
        ),
    )
    ttft_ticks = format_html_join(
        "",
        '<span class="tick" data-at="{}">{}</span>',
        ((quarter * 25, label) for quarter, label in enumerate(("0.01 s", "0.1 s", "1 s", "10 s", "100 s"))),
    )
    earlier = format_html('<a class="chart-earlier" href="{}">{} earlier requests</a>', full_url, more) if more else ""
    bars_markup = mark_safe("".join(bar_html(bar, window=window, auto_at=auto_at) for bar in bars))
    return format_html(
        '<div class="cache-chart" id="cache-chart" data-window="{}" data-bars="{}" role="group" '
        'aria-label="Cache hits per model request">'
        '<div class="axis tokens" title="The prompt as a share of the context window">{}</div>'
        '<div class="plot">{}<div class="bars" id="chart-bars" data-keep="{}">{}</div>'
        '<p class="empty-chart">No model requests yet.</p></div>'
        '<div class="axis ttft" title="Time to the first token, each step ten times the one below">{}</div></div>'
        "{}"
        '<ul class="legend"><li class="l-cached">cached prompt tokens</li><li class="l-uncached">uncached</li>'
        '<li class="l-unknown">cache not reported</li><li class="l-failed">failed request</li>'
        '<li class="l-ttft">time to first token</li><li class="l-threshold">compaction at {} % of the window</li>'
        '<li class="l-marks">above a bar, why the prefix broke: {}</li></ul>',
        window,
        len(bars),
        ticks,
        earlier,
        SHOWN_BARS,
        bars_markup,
        ttft_ticks,
        axis_titles(window),
        round(auto_at * 100),
        _legend_marks(),
    )


def axis_titles(window: int) -> SafeString:
    """The axes' titles, the window the bars are drawn against named: drawn again with each bar, so that a model
    changed or a server started with another window never leaves the chart naming an old one."""
    return format_html(
        '<p class="axis-titles" id="axis-titles"><span>prompt, share of the {} token window</span>'
        "<span>time to first token</span></p>",
        f"{window:,}",
    )


def _turn_label(turn: Turn) -> str:
    """The turn as the page numbers it, its place in the live branch; the stored number where that differs."""
    stored = f" (stored {turn.number})" if turn.number != turn.position else ""
    return f" · turn {turn.position}{stored}"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def totals_brief(totals: RequestTotals) -> str:
    """The summary line's figures in the few words a session list has room for ("" with no requests)."""
    if not totals.requests:
        return ""
    share = totals.cached_share
    cached = f", {share * 100:.0f} % cached" if share is not None else ""
    parts = [
        f"{totals.requests:,} request{'s' if totals.requests != 1 else ''}",
        f"{totals.prompt_tokens:,} tokens{cached}",
        f"{totals.processed_tokens:,} processed in {_duration(totals.prompt_seconds)}",
    ]
    saved = totals.saved_seconds
    if totals.cached_tokens and saved is not None:
        parts.append(f"the cache saved {_duration(saved)}")
    return ", ".join(parts)


def headline_text(totals: RequestTotals) -> str:
    """The chart's summary in a few words, for the page's header: requests, and the share of their prompts cached."""
    if not totals.requests:
        return "No requests yet"
    share = totals.cached_share
    cached = f" · {share * 100:.0f} % cached" if share is not None else ""
    return f"{totals.requests:,} request{'s' if totals.requests != 1 else ''}{cached}"


def summary_text(totals: RequestTotals) -> str:
    """The chart's summary line: the session's requests added up, and what the prompt cache saved."""
    if not totals.requests:
        return "No requests yet."
    parts = [f"{totals.requests:,} request{'s' if totals.requests != 1 else ''}"]
    share = totals.cached_share
    cached = f", {share * 100:.0f} % cached" if share is not None else ""
    parts.append(f"{totals.prompt_tokens:,} prompt tokens{cached}")
    parts.append(f"{totals.processed_tokens:,} processed in {_duration(totals.prompt_seconds)}")
    if totals.cached_tokens:
        saved = totals.saved_seconds
        at_speed = f", about {_duration(saved)} at this server's measured speed" if saved is not None else ""
        parts.append(f"the cache saved {totals.cached_tokens:,} tokens{at_speed}")
    return " · ".join(parts)
