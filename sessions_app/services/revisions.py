"""The session's revision: a counter every change of what its page shows moves on, so a page that
reconnects asks only for what changed after the revision it shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from sessions_app.models import ChatSession, Turn
from sessions_app.services.durability import WITHOUT_WAITING


def revision_next(session_id: int) -> int:
    """Move the session's revision on by one and return it; the caller's transaction holds the row."""
    table = connection.ops.quote_name(ChatSession._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET revision = revision + 1 WHERE id = %s RETURNING revision", [session_id])
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"No session {session_id}.")
    return int(row[0])


@dataclass(frozen=True)
class TurnBump:
    """Common table expressions that move the session's revision on and mark a turn changed at it: ``marked``
    gives ``revision`` (the new one) and ``taken`` (the session's result number before the bump)."""

    sql: str
    params: list[Any]


def turn_bump(turn: Turn, *, take_result_number: bool = False, if_next: int | None = None) -> TurnBump:
    """The bump of ``turn``'s session, to put after ``WITH`` in the statement that changes the turn (a step is
    stored at every step of a reply, so its revision moves on in the same statement). ``if_next``: only where
    that is the session's next result number. Where the turn is gone (or the number taken), nothing changes
    and ``marked`` is empty."""
    sessions = connection.ops.quote_name(ChatSession._meta.db_table)
    turns = connection.ops.quote_name(Turn._meta.db_table)
    also = ", next_result_number = next_result_number + 1, updated_at = now()" if take_result_number else ""
    params: list[Any] = [turn.session_id, turn.pk]
    where = f" AND EXISTS (SELECT FROM {turns} WHERE {turns}.id = %s AND {turns}.session_id = {sessions}.id)"
    if if_next is not None:
        where += " AND next_result_number = %s"
        params.append(if_next)
    return TurnBump(
        f"bumped AS (UPDATE {sessions} SET revision = revision + 1{also} WHERE id = %s{where} "
        "RETURNING revision, next_result_number - 1 AS taken), "
        f"marked AS (UPDATE {turns} SET revision = bumped.revision FROM bumped WHERE {turns}.id = %s "
        "RETURNING bumped.revision, bumped.taken)",
        [*params, turn.pk],
    )


def result_number_next(turn: Turn, *, without_waiting: bool = False) -> int:
    """Take the session's next result number for a result of ``turn``: the revision moves on and the turn is
    marked changed at it, in the same statement (``without_waiting``: and the commit will not wait for the
    disk, ``sessions_app.services.durability``)."""
    bump = turn_bump(turn, take_result_number=True)
    also = f", {WITHOUT_WAITING}" if without_waiting else ""
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {bump.sql} SELECT revision, taken{also} FROM marked", bump.params)
        row = cursor.fetchone()
    if row is None:
        raise Turn.DoesNotExist(f"No turn {turn.pk} in session {turn.session_id}.")
    turn.revision = int(row[0])
    return int(row[1])
