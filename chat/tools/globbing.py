"""Glob patterns: ``*``, ``?``, ``[...]`` within a name, ``**`` across folders, ``{a,b}`` alternatives."""

from __future__ import annotations

import re

MAX_ALTERNATIVES = 64
_BRACES = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """The patterns ``pattern`` stands for: ``*.{py,md}`` is ``*.py`` and ``*.md`` (at most 64; past
    that, the rest of the braces are taken literally)."""
    pending = [pattern]
    done: list[str] = []
    while pending:
        current = pending.pop(0)
        match = _BRACES.search(current)
        choices = match.group(1).split(",") if match else []
        if match is None or len(done) + len(pending) + len(choices) > MAX_ALTERNATIVES:
            done.append(current)
            continue
        head, tail = current[: match.start()], current[match.end() :]
        pending.extend(head + choice + tail for choice in choices)
    return done


def segments(pattern: str) -> list[str]:
    """The ``/``-separated parts of ``pattern``; empty and ``.`` parts dropped, ``**`` runs merged."""
    parts: list[str] = []
    for part in pattern.split("/"):
        if part in ("", ".") or (part == "**" and parts and parts[-1] == "**"):
            continue
        parts.append(part)
    return parts


def segment_regex(segment: str) -> str:
    """The regular expression of one name pattern; no part of it matches ``/``."""
    out: list[str] = []
    index, size = 0, len(segment)
    while index < size:
        char = segment[index]
        index += 1
        if char == "*":
            if not out or out[-1] != "[^/]*":
                out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = index
            if end < size and segment[end] == "!":
                end += 1
            if end < size and segment[end] == "]":
                end += 1
            while end < size and segment[end] != "]":
                end += 1
            if end >= size:
                out.append("\\[")
                continue
            inner = segment[index:end].replace("\\", "\\\\")
            index = end + 1
            inner = re.sub(r"([&~|])", r"\\\1", inner)
            if inner.startswith("!"):
                inner = "^" + inner[1:]
            elif inner.startswith("^"):
                inner = "\\" + inner
            out.append(f"[{inner}]")
        else:
            out.append(re.escape(char))
    return "".join(out)


def name_regex(segment: str) -> re.Pattern[str]:
    """A regular expression matching one file or folder name against ``segment``."""
    return re.compile(segment_regex(segment), re.DOTALL)
