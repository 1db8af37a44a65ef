"""The session's revision: a counter every change of what its page shows moves on, so a page that
reconnects asks only for what changed after the revision it shows."""

from __future__ import annotations

from django.db import connection

from sessions_app.models import ChatSession


def revision_next(session_id: int) -> int:
    """Move the session's revision on by one and return it; the caller's transaction holds the row."""
    table = connection.ops.quote_name(ChatSession._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET revision = revision + 1 WHERE id = %s RETURNING revision", [session_id])
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"No session {session_id}.")
    return int(row[0])
