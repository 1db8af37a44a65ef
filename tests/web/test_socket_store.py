"""The consumers' store calls keep one connection between messages, and replace one that stopped answering."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections

from chat.web.socket_store import store_call

pytestmark = pytest.mark.django_db(transaction=True)


def _backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


async def _asked() -> int:
    return await store_call(_backend)()


def _terminate(pid: int) -> None:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


def test_calls_keep_their_connection_and_a_dead_one_is_replaced_without_an_error() -> None:
    first = async_to_sync(_asked)()
    assert async_to_sync(_asked)() == first, "the second message found the first one's connection open"
    _terminate(first)
    replaced = async_to_sync(_asked)()
    assert replaced != first
    assert async_to_sync(_asked)() == replaced
