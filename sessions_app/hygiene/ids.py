"""Result ids: ``#`` and the result's number in the session, in lowercase hex."""

from __future__ import annotations

ID_MARK = "#"
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def format_id(number: int, digits: int) -> str:
    """``#`` and ``number`` in lowercase hex, zero-padded to at least ``digits`` digits."""
    return f"{ID_MARK}{number:0{digits}x}"


def parse_id(text: str) -> int | None:
    """The number of an id given as hex, with or without ``#`` and leading zeros; ``None`` if not one.

    ``#0000`` is well formed (``0``): an id no session ever gives, not a malformed one.
    """
    digits = text.strip().removeprefix(ID_MARK)
    if not digits or not set(digits) <= _HEX_DIGITS:
        return None
    return int(digits, 16)
