"""After a compaction (spec §7): the summary under its heading, and the table of the reads it covers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .config import ContextConfig
from .ids import format_id
from .lines import NEWLINE
from .paths import table_path


@dataclass(frozen=True)
class TableRead:
    """A full read the summary covers; ``path`` as the call gave it, ``abs_path`` identifies the file."""

    number: int
    path: str
    abs_path: str
    first_line: int
    last_line: int
    total_lines: int
    sha256: str


def compaction_table(reads: Sequence[TableRead], *, config: ContextConfig) -> str:
    """The table of the newest read of each file, newest last, at most ``compaction_rows``; ``""`` if none.

    ``reads`` are the full reads the summary covers, oldest first.
    """
    newest: dict[str, TableRead] = {}
    for read in reads:
        newest.pop(read.abs_path, None)
        newest[read.abs_path] = read
    kept = list(newest.values())[max(0, len(newest) - config.compaction_rows) :]
    if not kept:
        return ""
    lines = [config.text("table_heading"), config.text("table_sentence"), config.text("table_header")]
    lines.extend(_row(read, config) for read in kept)
    return NEWLINE.join(lines)


def _row(read: TableRead, config: ContextConfig) -> str:
    full_id = format_id(read.number, config.id_digits)
    sha = read.sha256[: config.sha_digits]
    path = table_path(read.path)
    if read.total_lines == 0:
        return config.text("table_row_empty", path=path, sha=sha, id=full_id)
    return config.text(
        "table_row",
        path=path,
        first=read.first_line,
        last=read.last_line,
        total=read.total_lines,
        sha=sha,
        id=full_id,
    )


def system_prompt_with_summary(base: str, *, summary: str, table: str, config: ContextConfig) -> str:
    """``base``, the summary under its heading, and the table when there is one, blank-line separated."""
    blocks = [base.rstrip(NEWLINE), config.text("summary_heading"), summary.strip()]
    if table:
        blocks.append(table)
    return (NEWLINE * 2).join(blocks)
