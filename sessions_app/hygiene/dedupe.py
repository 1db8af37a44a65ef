"""The dedupe table (spec §2, §6): the results already in the request being built, and ``Same result as``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What a result is, as the dedupe table and the stale notices need to know."""

    READ = "read"
    STUB = "stub"
    LISTING = "listing"
    SAME = "same"
    EDIT = "edit"
    OUTPUT = "output"
    RECALL = "recall"
    ERROR = "error"


READ_KINDS = frozenset({Kind.READ, Kind.STUB})


@dataclass(frozen=True)
class PriorResult:
    """One result already in the request being built; ``changed_files`` holds an edit's (abs_path, sha)."""

    number: int
    tool: str
    args_key: str
    kind: str
    full_text: str
    abs_path: str | None = None
    sha256: str | None = None
    first_line: int | None = None
    last_line: int | None = None
    changed_files: tuple[tuple[str, str], ...] = ()


def args_key(arguments: object) -> str:
    """A call's arguments as JSON with sorted keys: equal arguments give equal keys."""
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def newest_same_listing(
    table: Sequence[PriorResult], *, tool: str, arguments_key: str, body: str
) -> PriorResult | None:
    """The newest full listing in ``table`` of the same tool and arguments whose text is ``body``."""
    for entry in reversed(table):
        if (
            entry.kind == Kind.LISTING
            and entry.tool == tool
            and entry.args_key == arguments_key
            and entry.full_text == body
        ):
            return entry
    return None
