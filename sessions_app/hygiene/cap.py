"""Large output is capped on the way in (spec §3): head, one elided line, tail."""

from __future__ import annotations

from .config import CapLimits, ContextConfig
from .lines import NEWLINE, content_end, count_lines, measured_chars


def is_over_cap(body: str, limits: CapLimits) -> bool:
    """Whether ``body`` has more lines than ``max_lines`` or more characters than ``max_chars``."""
    return count_lines(body) > limits.max_lines or measured_chars(body) > limits.max_chars


def cap_text(body: str, *, full_id: str, limits: CapLimits, config: ContextConfig) -> str:
    """``body`` unchanged when within the cap; else its head, the elided line naming ``full_id``, its tail.

    Head and tail are whole lines, each counting its characters plus one for its newline, taken while
    both of their limits hold; the tail never overlaps the head. A first line that does not fit the head
    whole is shown whole when its own characters (its newline not counted) are not over ``head_chars``, else
    cut to ``head_chars`` characters and marked; either way the elided line follows it, even at 0.
    """
    if not is_over_cap(body, limits):
        return body
    line_total = count_lines(body)
    end = content_end(body)
    head_count, head_stop = _head(body, end, line_total, limits)
    parts: list[str] = []
    if head_count:
        parts.append(body[:head_stop])
    elif limits.head_lines > 0 and line_total > 0:
        first_end = body.find(NEWLINE, 0, end)
        first_end = end if first_end == -1 else first_end
        if first_end <= limits.head_chars:  # "over" is the line's own characters: exactly head_chars is whole
            parts.append(body[:first_end])
        else:
            parts.append(body[: limits.head_chars] + config.text("cut"))
        head_count = 1
    tail_count, tail_start = _tail(body, end, line_total - head_count, limits)
    parts.append(config.text("elided", count=line_total - head_count - tail_count, id=full_id))
    if tail_count:
        parts.append(body[tail_start:end])
    return NEWLINE.join(parts)


def _head(body: str, end: int, line_total: int, limits: CapLimits) -> tuple[int, int]:
    """How many whole lines the head takes, and the index where the last of them ends."""
    count = used = start = stop = 0
    while count < min(line_total, limits.head_lines):
        newline = body.find(NEWLINE, start, end)
        line_end = end if newline == -1 else newline
        used += line_end - start + 1
        if used > limits.head_chars:
            break
        count += 1
        stop = line_end
        start = line_end + 1
    return count, stop


def _tail(body: str, end: int, available: int, limits: CapLimits) -> tuple[int, int]:
    """How many whole lines the tail takes from the last ``available`` ones, and where the first begins."""
    count = used = 0
    cursor = start = end
    while count < min(available, limits.tail_lines):
        line_start = body.rfind(NEWLINE, 0, cursor) + 1
        used += cursor - line_start + 1
        if used > limits.tail_chars:
            break
        count += 1
        start = line_start
        cursor = line_start - 1
    return count, start
