"""Text as Postgres can store it."""

from __future__ import annotations

NUL_STANDIN = "\u2400"


def pg_safe(text: str) -> str:
    """Postgres text cannot hold NUL; what is sent is built from what is stored, so both see the stand-in."""
    return text.replace("\x00", NUL_STANDIN) if "\x00" in text else text
