"""Bookkeeping commits do not wait for the disk; every other commit still does."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from sessions_app.services.durability import WITHOUT_WAITING, commit_without_waiting_for_disk

pytestmark = pytest.mark.django_db(transaction=True)


def _setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        row = cursor.fetchone()
    return str(row[0]) if row else ""


def test_only_the_transaction_that_asks_commits_without_waiting() -> None:
    assert _setting() == "on"
    with transaction.atomic():
        commit_without_waiting_for_disk()
        assert _setting() == "off"
    assert _setting() == "on", "the next transaction waits for the disk again"
    with transaction.atomic():
        assert _setting() == "on"


def test_a_statement_that_is_its_own_transaction_asks_for_itself_alone() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT current_setting('synchronous_commit'), {WITHOUT_WAITING}")
        row = cursor.fetchone()
    assert row is not None and row[1] == "off"
    assert _setting() == "on", "outside atomic the setting ends with the statement's own transaction"
