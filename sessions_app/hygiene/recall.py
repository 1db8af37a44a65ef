"""``recall`` shows a stored result again, a window of lines at a time (spec §4)."""

from __future__ import annotations

from .config import ContextConfig
from .dedupe import Kind
from .ids import format_id
from .lines import count_lines, line_window
from .outcomes import RecallOutcome
from .rendered import Rendered, with_bracket


def render_recall(*, number: int, outcome: RecallOutcome, config: ContextConfig) -> Rendered:
    """The window of the stored text from ``offset``, at most ``recall_window`` lines, under its bracket.

    An unknown id and an offset past the end are errors (the latter reuses the ``offset_past_end`` text
    with the recalled id in place of the path).
    """
    full_id = format_id(number, config.id_digits)
    target = format_id(outcome.target, config.id_digits)
    if outcome.full_text is None:
        message = config.text("no_stored_result", target=target)
        return _error(number, full_id, message, None, config)
    if not outcome.full_text:
        inserted = config.text("recall_empty", id=full_id, target=target)
        return Rendered(number, inserted, "", Kind.RECALL, refers_to=outcome.target)
    total = count_lines(outcome.full_text)
    first = max(1, outcome.offset)
    if first > total:
        message = config.error("offset_past_end", offset=outcome.offset, path=target, total=total)
        return _error(number, full_id, message, outcome.target, config)
    last = min(total, first + max(1, min(outcome.limit, config.recall_window)) - 1)
    body = line_window(outcome.full_text, first, last - first + 1)
    bracket = config.text("recall_bracket", id=full_id, target=target, first=first, last=last, total=total)
    return Rendered(number, with_bracket(bracket, body), body, Kind.RECALL, refers_to=outcome.target)


def _error(number: int, full_id: str, message: str, refers_to: int | None, config: ContextConfig) -> Rendered:
    inserted = config.text("short", id=full_id, text=message)
    return Rendered(number, inserted, message, Kind.ERROR, refers_to=refers_to)
