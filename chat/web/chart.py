"""The cache-hit chart, drawn on the server as SVG: one bar per model request of a session.

Each bar stacks the prompt tokens the server had cached (dark) under those it had to process (light);
the time to first token is a line on the right-hand axis; a request whose prefix broke is marked above
its bar with the cause. Every bar has a ``<title>`` tooltip with the raw figures. No script, no styles:
presentation attributes only, so the page's content security policy holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from sessions_app.models import BreakCause, ModelRequest, RequestStatus

CACHED = "#2563eb"
UNCACHED = "#93c5fd"
UNKNOWN = "#cbd5e1"
FAILED = "#b91c1c"
TTFT = "#ea580c"
AXIS = "#6b7280"
GRID = "#e5e7eb"
CAUSE_COLORS: dict[str, str] = {BreakCause.UNEXPECTED: FAILED, BreakCause.FIRST: AXIS, BreakCause.NEW_TURN: AXIS}
CAUSE_DEFAULT = "#7c3aed"

LEFT, RIGHT, TOP, BOTTOM = 52, 52, 78, 58
PLOT_HEIGHT = 200
MIN_WIDTH = 400
MAX_STEP, MIN_STEP = 40, 12
TICKS = 4


@dataclass(frozen=True)
class Bar:
    """One request's figures, as the chart shows them."""

    index: int
    request: ModelRequest

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
        cause = self.request.break_cause
        return str(BreakCause(cause).label) if cause in BreakCause.values else cause

    def tooltip(self) -> str:
        request = self.request
        lines = [
            f"Request {self.index} · {request.kind}"
            + (f" · turn {request.turn.number}" if request.turn is not None else "")
            + (f" step {request.step_number}" if request.step_number else ""),
            f"prompt tokens: {_figure(request.prompt_tokens)}",
            "cached tokens: "
            + (_figure(request.cached_tokens) if request.cached_tokens is not None else "not reported"),
            f"uncached tokens: {self.uncached if request.prompt_tokens is not None else '—'}",
            f"completion tokens: {_figure(request.completion_tokens)}",
            f"time to first token: {_seconds(request.time_to_first_token)}",
            f"total time: {_seconds(request.total_time)}",
            f"bytes sent: {request.bytes_sent}",
            f"bytes shared with the request before: {request.shared_prefix_bytes}",
            f"prefix break: {self.cause_label or 'none'}",
        ]
        if request.status == RequestStatus.FAILED:
            lines.append(f"failed: {request.error}")
        return "\n".join(lines)


def _figure(value: int | None) -> str:
    return "—" if value is None else str(value)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return float(factor * power)
    return float(10 * power)


def _tick(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def chart_requests(requests: Iterable[ModelRequest]) -> list[Bar]:
    """The requests that have finished, numbered from 1 in the order they were sent."""
    finished = [request for request in requests if request.status != RequestStatus.SENDING]
    return [Bar(index, request) for index, request in enumerate(finished, start=1)]


def chart_svg(requests: Sequence[ModelRequest]) -> SafeString:
    bars = chart_requests(requests)
    count = len(bars)
    step = max(MIN_STEP, min(MAX_STEP, (MIN_WIDTH - LEFT - RIGHT) // max(count, 1)))
    plot_width = max(MIN_WIDTH - LEFT - RIGHT, step * count)
    width = LEFT + plot_width + RIGHT
    height = TOP + PLOT_HEIGHT + BOTTOM
    top_tokens = TICKS * nice_ceiling(max((bar.prompt for bar in bars), default=0) / TICKS)
    ttfts = [bar.request.time_to_first_token for bar in bars if bar.request.time_to_first_token is not None]
    top_ttft = TICKS * nice_ceiling(max(ttfts, default=0.0) / TICKS)
    base = TOP + PLOT_HEIGHT

    def y_tokens(value: float) -> float:
        return base - PLOT_HEIGHT * value / top_tokens

    def y_ttft(value: float) -> float:
        return base - PLOT_HEIGHT * value / top_ttft

    parts: list[str] = [
        format_html(
            '<svg xmlns="http://www.w3.org/2000/svg" class="cache-chart" viewBox="0 0 {} {}" width="{}" '
            'role="img" aria-label="Cache hits per model request" data-bars="{}" '
            'font-family="system-ui, sans-serif" font-size="11">',
            width,
            height,
            width if width > MIN_WIDTH else "100%",
            count,
        ),
        format_html("<title>{}</title>", f"Prompt tokens per request, cached and not ({count} requests)"),
    ]
    parts.append(_legend(base + 30))
    for fraction in (tick / TICKS for tick in range(TICKS + 1)):
        y = base - PLOT_HEIGHT * fraction
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="1"/>'
                '<text x="{}" y="{}" text-anchor="end" fill="{}">{}</text>'
                '<text x="{}" y="{}" fill="{}">{}</text>',
                LEFT,
                LEFT + plot_width,
                f"{y:.1f}",
                f"{y:.1f}",
                GRID,
                LEFT - 6,
                f"{y + 4:.1f}",
                AXIS,
                _tick(top_tokens * fraction),
                LEFT + plot_width + 6,
                f"{y + 4:.1f}",
                TTFT,
                f"{top_ttft * fraction:g} s",
            )
        )
    parts.append(
        format_html(
            '<text x="12" y="{}" fill="{}" transform="rotate(-90 12 {})" text-anchor="middle">prompt tokens</text>',
            f"{TOP + PLOT_HEIGHT / 2:.1f}",
            AXIS,
            f"{TOP + PLOT_HEIGHT / 2:.1f}",
        )
    )
    if not bars:
        parts.append(
            format_html(
                '<text x="{}" y="{}" text-anchor="middle" fill="{}">No model requests yet.</text>',
                LEFT + plot_width / 2,
                TOP + PLOT_HEIGHT / 2,
                AXIS,
            )
        )
    bar_width = max(6, step * 0.7)
    points: list[str] = []
    for position, bar in enumerate(bars):
        x = LEFT + position * step + (step - bar_width) / 2
        center = x + bar_width / 2
        parts.append(_bar(bar, x=x, width=bar_width, y_tokens=y_tokens, base=base))
        if bar.request.time_to_first_token is not None:
            points.append(f"{center:.1f},{y_ttft(bar.request.time_to_first_token):.1f}")
        if count <= 60 or bar.index % max(1, count // 30) == 0:
            parts.append(
                format_html(
                    '<text x="{}" y="{}" text-anchor="middle" fill="{}">{}</text>',
                    f"{center:.1f}",
                    base + 14,
                    AXIS,
                    bar.index,
                )
            )
    if points:
        parts.append(
            format_html(
                '<polyline class="ttft" points="{}" fill="none" stroke="{}" stroke-width="2"/>',
                " ".join(points),
                TTFT,
            )
        )
        for bar, point in zip(
            [bar for bar in bars if bar.request.time_to_first_token is not None], points, strict=True
        ):
            cx, cy = point.split(",")
            parts.append(
                format_html(
                    '<circle cx="{}" cy="{}" r="3" fill="{}"><title>Request {}: time to first token {}'
                    "</title></circle>",
                    cx,
                    cy,
                    TTFT,
                    bar.index,
                    _seconds(bar.request.time_to_first_token),
                )
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _legend(top: float) -> str:
    """Two rows under the axis: the bars and the line, then the break marker."""
    parts: list[str] = []
    x = float(LEFT)
    for kind, color, label in (
        ("rect", CACHED, "cached prompt tokens"),
        ("rect", UNCACHED, "uncached"),
        ("line", TTFT, "time to first token"),
    ):
        if kind == "rect":
            parts.append(format_html('<rect x="{}" y="{}" width="10" height="10" fill="{}"/>', x, top, color))
        else:
            parts.append(
                format_html(
                    '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="2"/>',
                    x,
                    x + 10,
                    top + 5,
                    top + 5,
                    color,
                )
            )
        parts.append(format_html('<text x="{}" y="{}" fill="#1d2127">{}</text>', x + 14, top + 9, label))
        x += 26 + 6.2 * len(label)
    parts.append(
        format_html('<path d="M{} {} l-5 -8 l10 0 z" fill="{}"/>', LEFT + 5, top + 24, CAUSE_DEFAULT)
        + format_html('<text x="{}" y="{}" fill="#1d2127">prefix break, named by its cause</text>', LEFT + 14, top + 25)
    )
    return "".join(parts)


def _bar(bar: Bar, *, x: float, width: float, y_tokens: Callable[[float], float], base: float) -> str:
    request = bar.request
    cached_top = y_tokens(bar.cached)
    prompt_top = y_tokens(bar.prompt)
    failed = request.status == RequestStatus.FAILED
    parts: list[str] = [
        format_html(
            '<g class="bar" data-request="{}" data-prompt="{}" data-cached="{}" data-cause="{}"><title>{}</title>',
            request.pk,
            _figure(request.prompt_tokens),
            _figure(request.cached_tokens),
            request.break_cause,
            bar.tooltip(),
        ),
        # a transparent full-height rectangle so the tooltip shows anywhere over the column
        format_html(
            '<rect x="{}" y="{}" width="{}" height="{}" fill="#ffffff" fill-opacity="0"/>',
            f"{x:.1f}",
            TOP,
            f"{width:.1f}",
            PLOT_HEIGHT,
        ),
    ]
    if request.prompt_tokens is not None:
        cached_color = CACHED if request.cached_tokens is not None else UNKNOWN
        parts.append(
            format_html(
                '<rect class="cached" x="{}" y="{}" width="{}" height="{}" fill="{}"/>'
                '<rect class="uncached" x="{}" y="{}" width="{}" height="{}" fill="{}"/>',
                f"{x:.1f}",
                f"{cached_top:.1f}",
                f"{width:.1f}",
                f"{base - cached_top:.1f}",
                cached_color,
                f"{x:.1f}",
                f"{prompt_top:.1f}",
                f"{width:.1f}",
                f"{cached_top - prompt_top:.1f}",
                UNCACHED if request.cached_tokens is not None else UNKNOWN,
            )
        )
    if failed:
        parts.append(
            format_html(
                '<rect class="failed" x="{}" y="{}" width="{}" height="3" fill="{}"/>',
                f"{x:.1f}",
                f"{base - 3:.1f}",
                f"{width:.1f}",
                FAILED,
            )
        )
    if request.break_cause:
        color = CAUSE_COLORS.get(request.break_cause, CAUSE_DEFAULT)
        center = x + width / 2
        parts.append(
            format_html(
                '<path class="break" d="M{} {} l5 -8 l-10 0 z" fill="{}"/>'
                '<text class="cause" x="{}" y="{}" fill="{}" transform="rotate(-50 {} {})">{}</text>',
                f"{center:.1f}",
                TOP - 2,
                color,
                f"{center + 2:.1f}",
                TOP - 14,
                color,
                f"{center + 2:.1f}",
                TOP - 14,
                bar.cause_label,
            )
        )
    parts.append("</g>")
    return "".join(parts)
