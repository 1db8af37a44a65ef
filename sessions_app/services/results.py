"""Inserting a tool result: the one place where the rules turn an outcome into the text the model is sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from django.db import transaction

from sessions_app import prompts
from sessions_app.hygiene import PriorResult, Rendered, args_key, render_result
from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import EditOutcome, Outcome, ReadOutcome
from sessions_app.models import Result, Step, Turn
from sessions_app.services.durability import commit_without_waiting_for_disk
from sessions_app.services.revisions import result_number_next
from sessions_app.text import storable, storable_json


def prior_result(result: Result) -> PriorResult:
    return PriorResult(
        number=result.number,
        tool=result.tool,
        args_key=result.args_key,
        kind=result.kind,
        full_text=result.full_text,
        abs_path=result.abs_path or None,
        sha256=result.sha256 or None,
        first_line=result.first_line,
        last_line=result.last_line,
        changed_files=tuple((change["abs_path"], change["sha256"]) for change in result.changed_files),
    )


def reply_table(turn: Turn) -> list[PriorResult]:
    """The dedupe table: the results of the reply in progress, which are all in the request being built."""
    return [prior_result(result) for result in Result.objects.filter(turn=turn).order_by("number")]


@transaction.atomic
def result_insert(
    *,
    turn: Turn,
    step: Step | None,
    call_id: str,
    tool: str,
    arguments: object,
    arguments_raw: str,
    outcome: Outcome,
    table: Sequence[PriorResult] | None = None,
    config: ContextConfig | None = None,
) -> Result:
    """Give the outcome the session's next id under the session row's lock and store it in full.

    ``table`` is the dedupe table, the results of this reply so far (read from the store when not given).
    The commit does not wait for the disk: the next request's record or the turn's end, which always follow,
    do (``sessions_app.services.durability``).
    """
    commit_without_waiting_for_disk()
    number = result_number_next(turn)
    key = storable(args_key(arguments))  # as stored, so it matches the keys of earlier results
    rendered: Rendered = render_result(
        number=number,
        tool=tool,
        args_key=key,
        outcome=outcome,
        table=list(table) if table is not None else reply_table(turn),
        config=config or prompts.rules_config(),
    )
    fields: dict[str, object] = {}
    if isinstance(outcome, ReadOutcome):
        fields = {
            "path": storable(outcome.path),
            "abs_path": storable(outcome.abs_path),
            "first_line": outcome.first_line,
            "last_line": outcome.last_line,
            "total_lines": outcome.total_lines,
            "sha256": outcome.sha256,
        }
    elif isinstance(outcome, EditOutcome):
        fields = {
            "changed_files": storable_json([asdict(change) for change in outcome.changes]),
            "path": storable(outcome.changes[0].path) if len(outcome.changes) == 1 else "",
            "abs_path": storable(outcome.changes[0].abs_path) if len(outcome.changes) == 1 else "",
        }
    result = Result.objects.create(
        session_id=turn.session_id,
        number=number,
        turn=turn,
        step=step,
        call_id=storable(call_id),
        tool=storable(tool),
        arguments=None if isinstance(arguments, str) else storable_json(arguments),
        arguments_raw=storable(arguments_raw),
        args_key=key,
        kind=rendered.kind,
        full_text=storable(rendered.full_text),
        inserted_text=storable(rendered.inserted_text),
        refers_to=rendered.refers_to,
        stale=list(rendered.stale),
        **fields,
    )
    return result
