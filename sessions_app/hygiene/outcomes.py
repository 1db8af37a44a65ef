"""What a tool hands to the rules: the facts of one call, before it has an id or a text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ReadOutcome:
    """A window of a text file. ``body`` is its ``N: text`` lines joined by ``\\n``. ``converted`` names the kind
    of document (``PDF``) whose text the lines are, or is empty for a text file; ``sha256`` is of the file's
    bytes either way."""

    path: str
    abs_path: str
    offset: int
    limit: int
    first_line: int
    last_line: int
    total_lines: int
    sha256: str
    body: str
    converted: str = ""


@dataclass(frozen=True)
class ListingOutcome:
    """The text of ``list``, ``glob`` or ``grep``: compared whole for ``Same result as``."""

    body: str


@dataclass(frozen=True)
class FileChange:
    """One file an edit changed. ``sha256`` is the new content's hash, ``""`` when deleted."""

    path: str
    abs_path: str
    action: Literal["update", "create", "delete"]
    sha256: str
    diff: str = ""
    lines: int = 0
    previous_sha256: str | None = None
    previous_text: str | None = None


@dataclass(frozen=True)
class EditOutcome:
    """``edit``, ``multiedit``, ``write`` or ``apply_patch``; ``several``: a patch over several files."""

    changes: tuple[FileChange, ...]
    several: bool = False


@dataclass(frozen=True)
class OutputOutcome:
    """A command's output, its exit or timeout line included."""

    text: str


@dataclass(frozen=True)
class RecallOutcome:
    """``recall``: ``full_text`` is ``None`` when the session never gave ``target``."""

    target: int
    full_text: str | None
    offset: int
    limit: int


@dataclass(frozen=True)
class ErrorOutcome:
    """An error or a refusal: one line saying what went wrong."""

    message: str


Outcome = ReadOutcome | ListingOutcome | EditOutcome | OutputOutcome | RecallOutcome | ErrorOutcome
