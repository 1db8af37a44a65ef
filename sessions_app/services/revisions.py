"""The session's revision: a counter every change of what its page shows moves on, so a page that
reconnects asks only for what changed after the revision it shows."""

from __future__ import annotations

from django.db import connection

from sessions_app.models import ChatSession, Turn


def revision_next(session_id: int) -> int:
    """Move the session's revision on by one and return it; the caller's transaction holds the row."""
    table = connection.ops.quote_name(ChatSession._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET revision = revision + 1 WHERE id = %s RETURNING revision", [session_id])
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"No session {session_id}.")
    return int(row[0])


def turn_revision_next(turn: Turn) -> int:
    """Move the session's revision on and mark ``turn`` changed at it, in one statement (a step is stored at
    every step of a reply)."""
    revision, _ = _turn_bumped(turn, also="")
    return revision


def result_number_next(turn: Turn) -> int:
    """Take the session's next result number for a result of ``turn``: the revision moves on and the turn is
    marked changed at it, in the same statement."""
    _, number = _turn_bumped(turn, also=", next_result_number = next_result_number + 1, updated_at = now()")
    return number


def _turn_bumped(turn: Turn, *, also: str) -> tuple[int, int]:
    """The session's new revision (now ``turn``'s too) and its result number before ``also`` ran."""
    sessions = connection.ops.quote_name(ChatSession._meta.db_table)
    turns = connection.ops.quote_name(Turn._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH bumped AS (UPDATE {sessions} SET revision = revision + 1{also} WHERE id = %s "
            "RETURNING revision, next_result_number - 1 AS taken) "
            f"UPDATE {turns} SET revision = bumped.revision FROM bumped WHERE {turns}.id = %s "
            "RETURNING bumped.revision, bumped.taken",
            [turn.session_id, turn.pk],
        )
        row = cursor.fetchone()
    if row is None:
        raise Turn.DoesNotExist(f"No turn {turn.pk} in session {turn.session_id}.")
    turn.revision = int(row[0])
    return turn.revision, int(row[1])
