"""``chat.web.sync``: what a tab that connects or reconnects is sent to reach the session as stored."""

from __future__ import annotations

import json

import pytest

from chat.web.sync import PageState, catch_up
from sessions_app.models import ChatSession
from sessions_app.services.turns import turn_start
from sessions_app.services.uploads import upload_record

pytestmark = pytest.mark.django_db


def _attachments_html(session: ChatSession, revision: int) -> list[str]:
    caught = catch_up(session.pk, PageState(revision=revision, first_turn=1, last_bar=0))
    messages = [json.loads(text) for text in caught.messages]
    return [op["html"] for message in messages for op in message["ops"] if op.get("id") == "attachments"]


def test_a_tab_rendered_while_a_file_waited_learns_that_a_message_took_it(chat_session: ChatSession) -> None:
    upload_record(session=chat_session, path="notes.txt", size=6, sha256="0" * 64)
    rendered_at = ChatSession.objects.get(pk=chat_session.pk).revision
    [waiting] = _attachments_html(chat_session, rendered_at)
    assert "notes.txt" in waiting
    turn_start(session=chat_session, words="What is in it?", today="2026-12-05", instructions=None)
    [after] = _attachments_html(chat_session, rendered_at)
    assert "notes.txt" not in after, "New chat's files went with the first message: none waits on the page"


def test_a_tab_that_connects_after_the_model_titled_the_session_gets_the_title_in_the_sidebar_too(
    chat_session: ChatSession,
) -> None:
    from sessions_app.services.sessions import session_title_by_model

    turn_start(session=chat_session, words="What is in it?", today="2026-12-05", instructions=None)
    rendered_at = ChatSession.objects.get(pk=chat_session.pk).revision
    assert session_title_by_model(session_id=chat_session.pk, answer="Notes overview") is not None
    caught = catch_up(chat_session.pk, PageState(revision=rendered_at, first_turn=1, last_bar=0))
    puts = {op["id"]: op["html"] for text in caught.messages for op in json.loads(text)["ops"]}
    assert "Notes overview" in puts["session-title"]
    assert "Notes overview" in puts[f"side-title-{chat_session.pk}"]
