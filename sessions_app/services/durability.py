"""Commits that need not wait for the disk: what they write is bookkeeping that the next write makes whole.

A commit waits until Postgres has flushed its WAL to disk (measured here: 0.5 to 4 ms, against 0.2 ms
without, and 15 to 80 ms now and then while Postgres writes a checkpoint). For a finished model request's
figures, the last request's body and a step's draft text, Cachet does not wait: Postgres still applies commits
in order (the next commit that waits flushes these too), so nothing can be half-written; a crash of Postgres or
of the machine itself (not of Cachet) within about 0.6 s can lose such a row, as a crash of Cachet loses the
last second of a draft.

A tool result's commit does not wait either, nor the record of the request that carries the results to the
model: right after that request is sent, the record of the model's answer before it waits, and so flushes
the step, its results and the request, before the model's next answer is read. Where no answer is held (the
first request of a reply), nothing of the reply is stored before the request but its record; at the end, the
turn's own commit waits. So the flush is one a step, and not between the model's answer and the next
request: a crash of Postgres or of the machine in the milliseconds between can lose that step, as it would
a moment earlier, and the reply then stops there (its answer cannot be stored either).

A step's commit waits only where one of its calls may change something outside the store (a write, an edit,
a command): that step is on disk before the call runs. A step whose calls only read, or that ends the reply,
changes nothing meanwhile, and reaches the disk with the next commit that waits. The person's message and
the turn's end wait as always.
"""

from __future__ import annotations

from django.db import connection

WITHOUT_WAITING = "set_config('synchronous_commit', 'off', true)"
"""An expression that lets the commit of the transaction it runs in return before its WAL reaches the disk: a
statement that is its own transaction (outside ``atomic``) selects it rather than take a round trip of its own."""


def commit_without_waiting_for_disk() -> None:
    """Let the current transaction's commit return before its WAL reaches the disk."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {WITHOUT_WAITING}")
