"""Commits that need not wait for the disk: what they write is bookkeeping that the next write makes whole.

A commit waits until Postgres has flushed its WAL to disk (measured here: about 4 ms, against 0.5 ms
without). For a finished model request's figures, the last request's body and a step's draft text, Cachet does
not wait: Postgres still applies commits in order (the next commit that waits flushes these too), so
nothing can be half-written; a crash of Postgres or of the machine itself (not of Cachet) within about
0.6 s can lose such a row, as a crash of Cachet loses the last second of a draft.

A tool result's commit does not wait either, because what follows the results of a step is always a commit
that does: the next request's record before that request is sent, or the turn's end. So every result is on
disk before the model is asked again or the reply ends, at one flush a step instead of one a result.

A step's commit waits only where one of its calls may change something outside the store (a write, an edit,
a command): that step is on disk before the call runs. A step whose calls only read, or that ends the reply,
changes nothing meanwhile, and reaches the disk with the same next commit. The person's message, the
requests' records and the turn's end wait as always.
"""

from __future__ import annotations

from django.db import connection


def commit_without_waiting_for_disk() -> None:
    """Let the current transaction's commit return before its WAL reaches the disk."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")
