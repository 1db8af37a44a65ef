"""The session's reply lock: a Postgres advisory lock, so one reply, undo or compaction runs at a time.

It is the one truth of "a reply is running": some process holds the session's lock. Whoever takes it
first marks interrupted the open turns a dead process left, so a page never has to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection

from sessions_app.errors import ReplyInProgress
from sessions_app.models import ChatSession, Turn, TurnStatus
from sessions_app.services.turns import turns_interrupt_orphans

LOCK_NAMESPACE = 7355
ORPHAN_REASON = "The reply stopped when the server running it stopped; regenerate to ask again."


def _try_lock(session_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_NAMESPACE, session_id])
        row = cursor.fetchone()
    return bool(row and row[0])


def _unlock(session_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_NAMESPACE, session_id])


@contextlib.contextmanager
def reply_lock(session: ChatSession) -> Iterator[int]:
    """Hold the session's lock across processes; open turns found under it were left by a dead process (they
    are marked interrupted, and the block is given how many)."""
    if not _try_lock(session.pk):
        raise ReplyInProgress()
    try:
        yield turns_interrupt_orphans(session=session, reason=ORPHAN_REASON)
    finally:
        _unlock(session.pk)


_HELD = """
SELECT objid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = %s AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND objid = ANY(%s)
"""


def sessions_running(session_ids: list[int]) -> set[int]:
    """Which of the sessions some process is replying in right now; a read that takes no lock."""
    if not session_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_HELD, [LOCK_NAMESPACE, session_ids])
        return {int(row[0]) for row in cursor.fetchall()}


def reply_running(session: ChatSession) -> bool:
    """Whether some process holds the session's reply lock right now."""
    return session.pk in sessions_running([session.pk])


def orphans_interrupt() -> set[int]:
    """Mark interrupted every open turn whose session no process is replying in; the sessions that had one."""
    sessions = set()
    for session_id in set(Turn.objects.filter(status=TurnStatus.OPEN).values_list("session_id", flat=True)):
        session = ChatSession.objects.get(pk=session_id)
        with contextlib.suppress(ReplyInProgress), reply_lock(session) as interrupted:
            if interrupted:
                sessions.add(session_id)
    return sessions
