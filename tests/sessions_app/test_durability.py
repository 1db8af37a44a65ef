"""Bookkeeping commits do not wait for the disk; every other commit still does, and the flusher brings them there."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction

from sessions_app.services import durability
from sessions_app.services.durability import FLUSHER, WITHOUT_WAITING, commit_without_waiting_for_disk, flush_behind

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


def _lsn(function: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}()::text")
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def _reached(flushed: str, written: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn) >= 0", [flushed, written])
        row = cursor.fetchone()
    return bool(row and row[0])


def _flusher_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "disk-flusher" and thread.is_alive()]


def test_the_flusher_brings_to_the_disk_what_was_committed_without_waiting(django_user_model: Any) -> None:
    with transaction.atomic():
        commit_without_waiting_for_disk()
        django_user_model.objects.create_user(username="kept", password="x")
    written = _lsn("pg_current_wal_insert_lsn")
    number = FLUSHER.ask()
    assert FLUSHER.wait(number, timeout=10)
    assert _reached(_lsn("pg_current_wal_flush_lsn"), written)


def test_asks_that_come_while_a_flush_runs_share_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    started, go_on = threading.Event(), threading.Event()
    flushes: list[int] = []

    def slow_flush() -> None:
        flushes.append(len(flushes))
        started.set()
        go_on.wait(10)

    monkeypatch.setattr(durability, "_flush", slow_flush)
    FLUSHER.ask()
    assert started.wait(10)
    last = max(FLUSHER.ask() for _ in range(5))
    assert not FLUSHER.wait(last, timeout=0.05), "the asks made during a flush wait for the next one"
    go_on.set()
    assert FLUSHER.wait(last, timeout=10)
    assert len(flushes) == 2


def test_a_flush_that_fails_is_logged_and_the_next_one_works(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(durability, "FLUSH_STATEMENT", "SELECT cachet_no_such_function()")
    with caplog.at_level(logging.WARNING, logger=durability.__name__):
        assert FLUSHER.wait(FLUSHER.ask(), timeout=10)
    assert "could not bring the last commits to the disk" in caplog.text
    monkeypatch.undo()
    caplog.clear()
    with transaction.atomic():
        commit_without_waiting_for_disk()
        Group.objects.create(name="after the failure")
    written = _lsn("pg_current_wal_insert_lsn")
    assert FLUSHER.wait(FLUSHER.ask(), timeout=10)
    assert _reached(_lsn("pg_current_wal_flush_lsn"), written)
    assert not caplog.records


def test_the_flusher_is_asked_once_the_transaction_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def noted_ask() -> int:
        asked.append(1)
        return len(asked)

    monkeypatch.setattr(FLUSHER, "ask", noted_ask)
    with transaction.atomic():
        flush_behind()
        assert not asked, "inside atomic nothing is committed yet"
    assert asked == [1]
    flush_behind()
    assert asked == [1, 1], "outside atomic at once"


def test_the_thread_starts_at_the_first_ask_and_stop_ends_it_with_its_connection() -> None:
    def connections() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            row = cursor.fetchone()
        return int(row[0]) if row else 0

    FLUSHER.stop()
    assert not _flusher_threads()
    before = connections()
    assert FLUSHER.wait(FLUSHER.ask(), timeout=10)
    assert len(_flusher_threads()) == 1
    assert connections() == before + 1
    FLUSHER.stop()
    assert not _flusher_threads()
    deadline = time.monotonic() + 10
    while connections() != before and time.monotonic() < deadline:  # a backend ends just after its client
        time.sleep(0.05)
    assert connections() == before
    assert FLUSHER.wait(FLUSHER.ask(), timeout=10), "a later ask starts another"
