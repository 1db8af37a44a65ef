"""Opening a workspace file safely, telling text from binary, and the line model of the rules."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import BinaryIO

from .context import ToolContext
from .errors import printable
from .paths import Root

SNIFF_BYTES = 8192


def open_regular(path: str | Path, ctx: ToolContext) -> BinaryIO:
    """Open the workspace file at ``path`` for reading, resolved from the workspace's descriptor (see
    ``paths``); refused unless it is a regular file inside the workspace."""
    with Root(ctx) as root:
        return root.open_file(root.resolve(os.fspath(path)))


def is_binary(head: bytes) -> bool:
    """Whether a file whose first bytes are ``head`` is binary: a NUL byte in its first 8 KiB."""
    return b"\x00" in head[:SNIFF_BYTES]


def clean(text: str) -> str:
    """A string from the model with any lone surrogate replaced, so it can be written as UTF-8."""
    return text.encode("utf-8", "replace").decode("utf-8")


def decode_exact(data: bytes) -> str:
    """File content as text that encodes back to exactly ``data`` (see :func:`encode_exact`)."""
    return data.decode("utf-8", "surrogateescape")


def encode_exact(text: str) -> bytes:
    """The bytes of text made by :func:`decode_exact`, invalid UTF-8 of the file kept as it was."""
    return text.encode("utf-8", "surrogateescape")


def is_crlf(text: str) -> bool:
    """Whether ``text`` is a CRLF file: it has line breaks, and every ``\\n`` follows a ``\\r``."""
    return "\r\n" in text and text.count("\r\n") == text.count("\n")


def as_crlf(text: str) -> str:
    """``text`` with every line break ``\\r\\n``: a ``\\n`` alone gets its ``\\r``; nothing else changes."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def split_lines(text: str) -> list[str]:
    """The lines of ``text``: split at ``\\n``, a final newline adds no line."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def unified_diff(old_text: str, new_text: str) -> str:
    """The hunks of the unified diff (three lines of context) from ``old_text`` to ``new_text``."""
    lines = difflib.unified_diff(split_lines(old_text), split_lines(new_text), n=3, lineterm="")
    hunks = [printable(line.removesuffix("\r")) for index, line in enumerate(lines) if index >= 2]
    return "\n".join(hunks)
