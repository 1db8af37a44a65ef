"""Inserting a tool result: the one place where the rules turn an outcome into the text the model is sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from django.db import connection, transaction

from sessions_app import prompts
from sessions_app.hygiene import PriorResult, Rendered, args_key, render_result
from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import EditOutcome, Outcome, ReadOutcome
from sessions_app.models import Generation, Result, Step, Turn
from sessions_app.services.durability import WITHOUT_WAITING
from sessions_app.services.revisions import result_number_next, turn_bump
from sessions_app.services.rows import row_insert, row_stored, row_values
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
    """The dedupe table: the results of the reply in progress since it last compacted (§7 empties the table at every
    compaction, inside a reply too), which are all in the request being built."""
    results = list(Result.objects.filter(turn=turn).order_by("number"))
    if not results:  # a new reply: nothing to compare with, and no compaction to look for
        return []
    compacted = (
        Generation.objects.filter(session_id=turn.session_id, resumed_turn=turn.number, taken_back=False)
        .order_by("-number")
        .values_list("created_at", flat=True)
        .first()
    )
    return [prior_result(result) for result in results if compacted is None or result.created_at > compacted]


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
    number: int | None = None,
) -> Result:
    """Give the outcome the session's next id under the session row's lock and store it in full.

    ``table`` is the dedupe table, the results of this reply so far (read from the store when not given).
    ``number`` is the session's next id as the caller knows it (a reply holds the session's reply lock, and
    only replies take ids): then one statement takes it and stores the row where it is still the next one;
    otherwise, or where it is not, the id is taken first and the row stored after, in one transaction.
    The commit does not wait for the disk: the next request's record or the turn's end, which always follow,
    do (``sessions_app.services.durability``).
    """
    call_outcome = _Outcome(
        turn=turn,
        step=step,
        call_id=call_id,
        tool=tool,
        arguments=arguments,
        arguments_raw=arguments_raw,
        outcome=outcome,
        args_key=storable(args_key(arguments)),  # as stored, so it matches the keys of earlier results
        table=list(table) if table is not None else reply_table(turn),
        config=config or prompts.rules_config(),
    )
    if number is not None:
        result = call_outcome.row(number)
        if _stored_as_next(result, turn):
            return result
    return _result_insert_next(call_outcome)


@dataclass(frozen=True)
class _Outcome:
    """A call's outcome on its way to becoming result ``number`` of the reply."""

    turn: Turn
    step: Step | None
    call_id: str
    tool: str
    arguments: object
    arguments_raw: str
    outcome: Outcome
    args_key: str
    table: list[PriorResult]
    config: ContextConfig

    def row(self, number: int) -> Result:
        """The row of result ``number``: the rules render the outcome against the reply's results so far."""
        outcome = self.outcome
        rendered: Rendered = render_result(
            number=number, tool=self.tool, args_key=self.args_key, outcome=outcome, table=self.table, config=self.config
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
        return Result(
            session_id=self.turn.session_id,
            number=number,
            turn=self.turn,
            step=self.step,
            call_id=storable(self.call_id),
            tool=storable(self.tool),
            arguments=None if isinstance(self.arguments, str) else storable_json(self.arguments),
            arguments_raw=storable(self.arguments_raw),
            args_key=self.args_key,
            kind=rendered.kind,
            full_text=storable(rendered.full_text),
            inserted_text=storable(rendered.inserted_text),
            refers_to=rendered.refers_to,
            stale=list(rendered.stale),
            **fields,
        )


@transaction.atomic
def _result_insert_next(outcome: _Outcome) -> Result:
    result = outcome.row(result_number_next(outcome.turn, without_waiting=True))
    with connection.cursor() as cursor:
        cursor.execute(f"{row_insert(Result).sql} RETURNING id", row_values(result))
        row = cursor.fetchone()
    assert row is not None, "an insert returns its row"
    return row_stored(result, int(row[0]))


def _stored_as_next(result: Result, turn: Turn) -> bool:
    """Store ``result`` in one statement where its number is the session's next one (which it takes, under
    the session row's lock); whether it was."""
    bump = turn_bump(turn, take_result_number=True, if_next=result.number)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {bump.sql} {row_insert(Result).sql} FROM marked "
            f"RETURNING id, (SELECT revision FROM marked), {WITHOUT_WAITING}",
            [*bump.params, *row_values(result)],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    turn.revision = int(row[1])
    row_stored(result, int(row[0]))
    return True
