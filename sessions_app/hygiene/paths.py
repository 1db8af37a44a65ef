"""A path as the call gave it, shown in a bracket or a row of the compaction table (spec §1, §5, §7).

A newline or a carriage return in it would break a bracket over two lines, and a ``|`` would add a column to
a table row; each is written as its escape instead. Everything else of the path is as the call gave it.
"""

from __future__ import annotations


def bracket_path(path: str) -> str:
    """``path`` as a bracket shows it: a newline and a carriage return written ``\\n`` and ``\\r``."""
    return path.replace("\r", "\\r").replace("\n", "\\n")


def table_path(path: str) -> str:
    """``path`` as a row of the compaction table shows it: as in a bracket, and ``|`` written ``\\|``."""
    return bracket_path(path).replace("|", "\\|")
