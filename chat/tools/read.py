"""``read``: a window of a text file's lines, found in one streaming pass that also hashes the file."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from sessions_app.hygiene.outcomes import Outcome, ReadOutcome

from .args import checked
from .context import ToolContext
from .documents import document_bytes, document_kind, document_text, file_sha256
from .errors import ToolError, shown
from .files import SNIFF_BYTES, is_binary
from .paths import open_file

CHUNK_BYTES = 1 << 20
_NEWLINE = b"\n"


@dataclass
class Scan:
    """What one pass over a file found: its hash, its line count and the lines of the window."""

    sha256: str = ""
    total_lines: int = 0
    binary: bool = False
    lines: list[tuple[bytes, bool]] = field(default_factory=list)
    unterminated: bool = False  # the file's last line has no newline


WHOLE_LINE = 2**60
"""Reads are not capped (spec §3): a line is shown whole however long it is."""


def read(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Lines ``offset`` to ``offset + limit - 1`` of a text file, as ``N: text``; of a document (a PDF, …), of
    its text."""
    config = ctx.config
    call = checked(args, "read", ctx)
    given, offset, limit = call.text("path"), call.number("offset"), call.number("limit")
    line_chars = WHOLE_LINE
    converted = ""
    with open_file(ctx, given) as (path, handle):
        kind = document_kind(path, os.pread(handle.fileno(), SNIFF_BYTES, 0))
        if kind is None:
            scan = scan_window(handle, offset, offset + limit - 1, line_chars * 4)
        else:
            scan, converted = _document_window(handle, kind, offset, offset + limit - 1, path, ctx), kind
    if scan.binary:
        raise ToolError(config.error("binary", path=shown(path)))
    total = scan.total_lines
    if total == 0:
        return ReadOutcome(given, path, offset, limit, 0, 0, 0, scan.sha256, "", converted)
    if offset > total:
        raise ToolError(config.error("offset_past_end", offset=offset, path=shown(path), total=total))
    last = min(offset + limit - 1, total)
    cut = config.texts["cut"]
    body = "\n".join(
        f"{number}: {display_line(raw, truncated, line_chars, cut, ended=number < total or not scan.unterminated)}"
        for number, (raw, truncated) in enumerate(scan.lines, start=offset)
    )
    return ReadOutcome(given, path, offset, limit, offset, last, total, scan.sha256, body, converted)


def _document_window(handle: BinaryIO, kind: str, first: int, last: int, path: str, ctx: ToolContext) -> Scan:
    """The window of a document's text, with the SHA-256 of the file's bytes (read whole, up to the limit)."""
    data = document_bytes(handle, kind=kind, path=path, ctx=ctx)
    sha256 = file_sha256(data)
    text = document_text(data, kind=kind, sha256=sha256, path=path, ctx=ctx)
    scan = scan_window(io.BytesIO(text.encode("utf-8")), first, last, WHOLE_LINE * 4)
    scan.sha256 = sha256
    return scan


def display_line(raw: bytes, truncated: bool, max_chars: int, cut: str, *, ended: bool) -> str:
    """A line of a file as shown: UTF-8 with replacement, at most ``max_chars``; where it ``ended`` with a newline,
    the ``\\r`` before that newline is not shown (a lone ``\\r`` at the very end of a file is)."""
    if ended and not truncated:
        raw = raw.removesuffix(b"\r")
    text = raw.decode("utf-8", "replace")
    if truncated or len(text) > max_chars:
        return text[:max_chars] + cut
    return text


def scan_window(handle: BinaryIO, first: int, last: int, max_line_bytes: int) -> Scan:
    """Hash and count the lines of ``handle``, keeping lines ``first``-``last`` (at most
    ``max_line_bytes`` of each, flagged when cut). Memory stays within a chunk and the window."""
    scan = Scan()
    digest = hashlib.sha256()
    line = 1
    current = bytearray()
    truncated = False
    last_byte = b""
    chunk = handle.read(CHUNK_BYTES)
    if is_binary(chunk):
        scan.binary = True
        return scan
    while chunk:
        digest.update(chunk)
        last_byte = chunk[-1:]
        pos, size = 0, len(chunk)
        while pos < size:
            if line > last:
                line += chunk.count(_NEWLINE, pos)
                break
            if line < first:
                needed = first - line
                found = chunk.count(_NEWLINE, pos)
                if found < needed:
                    line += found
                    break
                pos = _nth_newline(chunk, pos, needed) + 1
                line = first
                continue
            newline = chunk.find(_NEWLINE, pos)
            end = size if newline < 0 else newline
            room = max_line_bytes - len(current)
            if end - pos > room:
                truncated = True
            current += chunk[pos : pos + max(0, min(room, end - pos))]
            if newline < 0:
                break
            scan.lines.append((bytes(current), truncated))
            current.clear()
            truncated = False
            line += 1
            pos = newline + 1
        chunk = handle.read(CHUNK_BYTES)
    newlines = line - 1
    unterminated = last_byte not in (b"", _NEWLINE)
    scan.total_lines = newlines + (1 if unterminated else 0)
    scan.unterminated = unterminated
    if unterminated and first <= line <= last:
        scan.lines.append((bytes(current), truncated))
    scan.sha256 = digest.hexdigest()
    return scan


def _nth_newline(chunk: bytes, start: int, count: int) -> int:
    """The index of the ``count``-th newline of ``chunk`` from ``start``; there are at least that many."""
    low, high = start, len(chunk) - 1
    while low < high:
        middle = (low + high) // 2
        if chunk.count(_NEWLINE, start, middle + 1) >= count:
            high = middle
        else:
            low = middle + 1
    return low
