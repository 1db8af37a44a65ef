"""The entry point: one tool outcome becomes the text inserted for the model and the text stored."""

from __future__ import annotations

from collections.abc import Sequence

from .cap import cap_text
from .config import ContextConfig
from .dedupe import Kind, PriorResult, newest_same_listing
from .edits import render_edit
from .ids import format_id
from .outcomes import (
    EditOutcome,
    ErrorOutcome,
    ListingOutcome,
    Outcome,
    OutputOutcome,
    ReadOutcome,
    RecallOutcome,
)
from .reads import render_read
from .recall import render_recall
from .rendered import Rendered, with_bracket


def render_result(
    *,
    number: int,
    tool: str,
    args_key: str,
    outcome: Outcome,
    table: Sequence[PriorResult],
    config: ContextConfig,
) -> Rendered:
    """The result numbered ``number`` of ``tool`` called with ``args_key``, given the dedupe ``table``."""
    if isinstance(outcome, ReadOutcome):
        return render_read(number=number, outcome=outcome, table=table, config=config)
    if isinstance(outcome, EditOutcome):
        return render_edit(number=number, outcome=outcome, table=table, config=config)
    if isinstance(outcome, RecallOutcome):
        return render_recall(number=number, outcome=outcome, config=config)
    full_id = format_id(number, config.id_digits)
    if isinstance(outcome, ErrorOutcome):
        inserted = config.text("short", id=full_id, text=outcome.message)
        return Rendered(number, inserted, outcome.message, Kind.ERROR)
    if isinstance(outcome, ListingOutcome):
        return _render_listing(number, full_id, tool, args_key, outcome.body, table, config)
    return _render_output(number, full_id, outcome, config)


def _render_listing(
    number: int,
    full_id: str,
    tool: str,
    arguments_key: str,
    body: str,
    table: Sequence[PriorResult],
    config: ContextConfig,
) -> Rendered:
    if tool in config.dedupe_by_result:
        earlier = newest_same_listing(table, tool=tool, arguments_key=arguments_key, body=body)
        if earlier is not None:
            same = config.text("same_result", earlier=format_id(earlier.number, config.id_digits))
            inserted = config.text("short", id=full_id, text=same)
            return Rendered(number, inserted, body, Kind.SAME, refers_to=earlier.number)
    capped = cap_text(body, full_id=full_id, limits=config.cap, config=config)
    return Rendered(number, with_bracket(config.text("bracket", id=full_id), capped), body, Kind.LISTING)


def _render_output(number: int, full_id: str, outcome: OutputOutcome, config: ContextConfig) -> Rendered:
    capped = cap_text(outcome.text, full_id=full_id, limits=config.cap, config=config)
    inserted = with_bracket(config.text("bracket", id=full_id), capped)
    return Rendered(number, inserted, outcome.text, Kind.OUTPUT)
