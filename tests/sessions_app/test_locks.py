from __future__ import annotations

import threading

import pytest
from django.db import connection

from sessions_app.errors import ReplyInProgress
from sessions_app.models import ChatSession, Turn, TurnStatus
from sessions_app.services.locks import orphans_interrupt, reply_lock, reply_running
from sessions_app.services.turns import turn_start

pytestmark = pytest.mark.django_db(transaction=True)


def test_server_start_interrupts_open_turns_nobody_runs(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="lost", today="2026-11-29", instructions=None)
    assert orphans_interrupt() == {chat_session.pk}
    turn.refresh_from_db()
    assert turn.status == TurnStatus.INTERRUPTED
    assert "regenerate" in turn.error


def test_a_running_reply_is_left_alone(chat_session: ChatSession) -> None:
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        try:
            with reply_lock(chat_session):
                turn_start(session=chat_session, words="running", today="2026-11-29", instructions=None)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    try:
        assert reply_running(chat_session)
        assert orphans_interrupt() == set()
        with pytest.raises(ReplyInProgress), reply_lock(chat_session):
            pass
        assert Turn.objects.get(words="running").status == TurnStatus.OPEN
    finally:
        release.set()
        thread.join()
    assert not reply_running(chat_session)
