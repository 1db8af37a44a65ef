"""What a worker says while Postgres is away: one line when it goes and one when it is back (``chat.worker.process``),
not a traceback from the queue's every poll, heartbeat and pool connection. Imports nothing of Django's apps: the
logging settings name :class:`OutageNoise`."""

from __future__ import annotations

import logging

import psycopg
from django.db.utils import InterfaceError, OperationalError
from procrastinate.exceptions import AppNotOpen, ConnectorException

NOISY = ("procrastinate", "asyncio")  # the loggers that repeat an outage at every try (the pool's: LOGGING)


def database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) says Postgres cannot be reached: refused, gone, a pool that waited for a
    connection in vain (``PoolTimeout`` is an ``OperationalError``), or the queue's pool being made again."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.OperationalError | psycopg.InterfaceError | OperationalError | InterfaceError):
            return True
        if isinstance(current, AppNotOpen | ConnectionError | TimeoutError):
            return True
        if isinstance(current, ConnectorException) and current.__cause__ is None:
            return False
        current = current.__cause__ or current.__context__
    return False


class OutageNoise(logging.Filter):
    """Drops what the queue's library and asyncio log about Postgres being away: the worker says it once itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(NOISY):
            return True
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not database_unavailable(error)
