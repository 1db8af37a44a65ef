"""An unchanged re-read is a stub (spec §2)."""

from __future__ import annotations

from collections.abc import Sequence

from .config import ContextConfig
from .dedupe import Kind, PriorResult
from .ids import format_id
from .outcomes import ReadOutcome
from .paths import bracket_path
from .rendered import Rendered, with_bracket


def containing_read(table: Sequence[PriorResult], outcome: ReadOutcome) -> PriorResult | None:
    """The newest full read in ``table`` of the same file and content showing every line ``outcome`` shows."""
    for entry in reversed(table):
        if (
            entry.kind == Kind.READ
            and entry.abs_path == outcome.abs_path
            and entry.sha256 == outcome.sha256
            and entry.first_line is not None
            and entry.last_line is not None
            and entry.first_line <= outcome.first_line
            and outcome.last_line <= entry.last_line
        ):
            return entry
    return None


def render_read(*, number: int, outcome: ReadOutcome, table: Sequence[PriorResult], config: ContextConfig) -> Rendered:
    """A read in full under its bracket, or its bracket and a stub naming the newest read that contains it.

    An empty file is always answered in full: its bracket alone says all a stub would, in fewer words,
    and it has no lines for a stub to name.
    """
    full_id = format_id(number, config.id_digits)
    sha = outcome.sha256[: config.sha_digits]
    path = bracket_path(outcome.path)
    converted = {"kind": outcome.converted} if outcome.converted else {}
    suffix = "_converted" if outcome.converted else ""
    if outcome.total_lines == 0:
        inserted = config.text("read_empty" + suffix, id=full_id, path=path, sha=sha, **converted)
        return _read_result(number, outcome, inserted, Kind.READ)
    bracket = config.text(
        "read_bracket" + suffix,
        id=full_id,
        path=path,
        first=outcome.first_line,
        last=outcome.last_line,
        total=outcome.total_lines,
        sha=sha,
        **converted,
    )
    earlier = containing_read(table, outcome)
    if earlier is None:
        return _read_result(number, outcome, with_bracket(bracket, outcome.body), Kind.READ)
    stub = config.text(
        "stub",
        earlier=format_id(earlier.number, config.id_digits),
        first=earlier.first_line,
        last=earlier.last_line,
    )
    return _read_result(number, outcome, with_bracket(bracket, stub), Kind.STUB, refers_to=earlier.number)


def _read_result(
    number: int, outcome: ReadOutcome, inserted: str, kind: Kind, refers_to: int | None = None
) -> Rendered:
    return Rendered(
        number=number,
        inserted_text=inserted,
        full_text=outcome.body,
        kind=kind,
        refers_to=refers_to,
        abs_path=outcome.abs_path,
        sha256=outcome.sha256,
        first_line=outcome.first_line,
        last_line=outcome.last_line,
    )
