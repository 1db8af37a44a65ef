"""Commits that need not wait for the disk: what they write is bookkeeping that the next write makes whole.

A commit waits until Postgres has flushed its WAL to disk (measured here: 0.5 to 4 ms, against 0.2 ms
without, and 15 to 80 ms now and then while Postgres writes a checkpoint). For a finished model request's
figures, the last request's body and a step's draft text, Cachet does not wait: Postgres still applies commits
in order (the next commit that waits flushes these too), so nothing can be half-written; a crash of Postgres or
of the machine itself (not of Cachet) within about 0.6 s can lose such a row, as a crash of Cachet loses the
last second of a draft.

A tool result's commit does not wait either, nor the record of the request that carries the results to the
model, nor that of the model's answer before it: right after that request is sent, :func:`flush_behind` asks
the process's flusher, a thread with a connection of its own, to bring to the disk everything committed so
far, while the reply's own thread goes on to read the model's next answer. So the flush is one a step, and
neither between the model's answer and the next request nor before that answer is read: a crash of Postgres
or of the machine in the milliseconds it takes can lose that step, as it would a moment earlier, and the reply
then stops there (its answer cannot be stored either). At the end, the turn's own commit waits.

A step's commit waits only where one of its calls may change something outside the store (a write, an edit,
a command): that step is on disk before the call runs. A step whose calls only read, or that ends the reply,
changes nothing meanwhile, and reaches the disk with the flush after the next request or the turn's end. The
person's message and the turn's end wait as always.
"""

from __future__ import annotations

import logging
import threading

from django.db import Error, connection, transaction

logger = logging.getLogger(__name__)

FLUSH_STATEMENT = "SELECT pg_logical_emit_message(true, 'cachet', 'flush')"
"""A statement that is a transaction of its own and writes to the WAL (a message that only logical decoding
reads), so its commit waits for the disk and, WAL being flushed in order, brings there every commit before it."""

WITHOUT_WAITING = "set_config('synchronous_commit', 'off', true)"
"""An expression that lets the commit of the transaction it runs in return before its WAL reaches the disk: a
statement that is its own transaction (outside ``atomic``) selects it rather than take a round trip of its own."""


def commit_without_waiting_for_disk() -> None:
    """Let the current transaction's commit return before its WAL reaches the disk."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {WITHOUT_WAITING}")


class DiskFlusher:
    """A thread with a connection of its own that brings to the disk what this process committed without
    waiting, off the path of whoever asked. Asks that come while a flush runs share the next one. The thread
    starts at the first ask (importing starts nothing) and holds its connection until :meth:`stop`."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._asked = 0
        self._flushed = 0
        self._stopping = False
        self._thread: threading.Thread | None = None

    def ask(self) -> int:
        """Ask for a flush of every commit so far; returns the ask's number for :meth:`wait`."""
        with self._changed:
            self._asked += 1
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="disk-flusher", daemon=True)
                self._thread.start()
            self._changed.notify_all()
            return self._asked

    def wait(self, number: int, timeout: float | None = None) -> bool:
        """Whether the flush that answers ask ``number`` has ended (tried: one that fails is logged) in time."""
        with self._changed:
            return self._changed.wait_for(lambda: self._flushed >= number, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Flush what was asked, close the connection and end the thread (a later ask starts another)."""
        with self._changed:
            thread, self._stopping = self._thread, True
            self._changed.notify_all()
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._asked > self._flushed or self._stopping)
                    if self._asked == self._flushed:
                        self._thread = None
                        return
                    asked = self._asked
                try:
                    _flush()
                except Exception:
                    logger.exception("the disk flush failed")
                with self._changed:
                    self._flushed = asked
                    self._changed.notify_all()
        finally:
            with self._changed:
                if self._thread is threading.current_thread():
                    self._thread = None
            connection.close()


def _flush() -> None:
    for attempt in (1, 2):
        try:
            with connection.cursor() as cursor:
                cursor.execute(FLUSH_STATEMENT)
            return
        except Error as error:
            connection.close()  # the next attempt connects afresh (Postgres restarted, say)
            if attempt == 2:
                logger.warning("could not bring the last commits to the disk: %s", error)


FLUSHER = DiskFlusher()


def flush_behind() -> None:
    """Once the current transaction commits (at once outside ``atomic``), have :data:`FLUSHER` bring every
    commit so far to the disk, without waiting for it."""
    transaction.on_commit(FLUSHER.ask)
