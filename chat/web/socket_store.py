"""The websocket consumers' calls into the store.

Channels runs every consumer's ``database_sync_to_async`` call on asgiref's one thread for thread-sensitive
code, and closes the connection after each (``CONN_MAX_AGE = 0``), so every message a tab sends opened a new
connection to Postgres: 3 ms here, and a new server process on Postgres's side. ``store_call`` keeps that
thread's connection from one message to the next and checks before each call that it still answers (0.1 ms);
one that does not (Postgres restarted, or an error left it unusable) is closed, and the call connects again.
"""

from __future__ import annotations

from typing import Any, ParamSpec, TypeVar

from asgiref.sync import SyncToAsync
from django.db import connection

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _KeptConnection(SyncToAsync[_P, _R]):
    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        return super().thread_handler(loop, *args, **kwargs)  # type: ignore[no-untyped-call]


store_call = _KeptConnection
