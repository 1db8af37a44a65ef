"""The one line a person sees for an error: no path, no host, no detail."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, InterfaceError, OperationalError

from sessions_app.errors import DATABASE_UNAVAILABLE, NoLiveTurnFrom, ReplyInProgress, person_message

SOCKET = 'connection to server on socket "/srv/cachet/.cachet/pg/.s.PGSQL.5432" failed: No such file or directory'


def test_store_errors_are_shown_as_they_are() -> None:
    assert person_message(ReplyInProgress()) == str(ReplyInProgress())
    assert person_message(NoLiveTurnFrom(7)) == "No live turn is left from turn 7 on; nothing was taken back."


@pytest.mark.parametrize(
    "error",
    [OperationalError(SOCKET), InterfaceError("connection already closed"), psycopg.OperationalError(SOCKET)],
)
def test_the_database_being_away_is_one_line(error: BaseException) -> None:
    assert person_message(error) == DATABASE_UNAVAILABLE == "The database is unavailable; your message is kept."


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (ValueError(f"bad value in {SOCKET}"), "Cachet failed: ValueError"),
        (PermissionError(13, "Permission denied", "/srv/cachet/secret_key"), "Cachet failed: PermissionError"),
        (DatabaseError("relation /x does not exist"), "Cachet failed: DatabaseError"),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "Cachet failed: UnicodeEncodeError"),
    ],
)
def test_anything_else_is_named_by_its_type_only(error: BaseException, shown: str) -> None:
    assert person_message(error) == shown
