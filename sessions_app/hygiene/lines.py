"""Lines of a text: split at ``\\n``, a final newline adds no line. Walked, never split into a list."""

from __future__ import annotations

NEWLINE = "\n"


def count_lines(text: str) -> int:
    """How many lines ``text`` has; ``""`` has none."""
    if not text:
        return 0
    return text.count(NEWLINE) + (0 if text.endswith(NEWLINE) else 1)


def measured_chars(text: str) -> int:
    """The characters of ``text`` as the cap counts them: each line's code points plus one for its newline."""
    if not text:
        return 0
    return len(text) + (0 if text.endswith(NEWLINE) else 1)


def content_end(text: str) -> int:
    """The index where the last line of ``text`` ends: before a final newline, if any."""
    return len(text) - 1 if text.endswith(NEWLINE) else len(text)


def line_window(text: str, first: int, count: int) -> str:
    """Lines ``first`` (1-based) to ``first + count - 1`` of ``text``, joined by ``\\n``, as they are."""
    end = content_end(text)
    start = 0
    for _ in range(first - 1):
        newline = text.find(NEWLINE, start, end)
        if newline == -1:
            return ""
        start = newline + 1
    stop = start
    for taken in range(1, count + 1):
        newline = text.find(NEWLINE, stop, end)
        if newline == -1:
            return text[start:end]
        if taken == count:
            return text[start:newline]
        stop = newline + 1
    return ""
