"""Text as Postgres can store it: one rule for every text a person or a model sends."""

from __future__ import annotations

import math
import re

NUL_STANDIN = "\u2400"
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` as it is stored, and so as it is sent again: NUL becomes ``␀``, a lone surrogate U+FFFD.

    Postgres text holds neither; a surrogate pair split in two (two deltas of a stream) becomes its character.
    """
    if "\x00" in text:
        text = text.replace("\x00", NUL_STANDIN)
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def storable_or_none(text: str | None) -> str | None:
    return None if text is None else storable(text)


def storable_json(value: object) -> object:
    """A JSON value as ``jsonb`` stores it: :func:`storable` on every string, keys too; ``NaN`` and the
    infinities (which Python's JSON reads but ``jsonb`` refuses) as the strings Python writes for them."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(key) if isinstance(key, str) else key: storable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def title_from(words: str) -> str:
    """A session's title taken from its first message: the words on one line, at most 80 characters."""
    return " ".join(words.split())[:80]
