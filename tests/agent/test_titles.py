"""Titles written by the model (issue 38, item 3): asked after the first reply as the next turn of the conversation
would ask, recorded like a compaction's request, never a turn, and never over a person's own title."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat import wire
from chat.agent.events import Titled
from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.agent.sampling import TITLE_MAX_TOKENS
from chat.web.chart import Bar, bar_html
from sessions_app import prompts
from sessions_app.models import BreakCause, ChatSession, ModelRequest, RequestKind, TitleSource, Turn
from sessions_app.services.requests import shared_prefix_bytes
from sessions_app.services.sessions import session_rename, session_title_by_model, title_from_answer
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)
FAST = Timeouts(connect=2.0, first_token=1.5, between_chunks=1.0)


def _loop(session: ChatSession, **kwargs: Any) -> ReplyLoop:
    return ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST, titles=True, **kwargs)


def _messages(body: bytes) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(body)["messages"]
    return messages


def test_after_the_first_reply_the_model_titles_the_session_as_the_next_turn_would_ask(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="It greets people."), Step(text='"Greeting helper."'), Step(text="Done."))
    outcome = run(_loop(scripted_session).send("what does app.py do?", date="2026-11-29"))
    titled = [event for event in outcome.events if isinstance(event, Titled)]
    assert [event.session.title for event in titled] == ["Greeting helper"]
    session = ChatSession.objects.get(pk=scripted_session.pk)
    assert (session.title, session.title_source) == ("Greeting helper", TitleSource.MODEL)
    reply, title = ModelRequest.objects.filter(session=session).order_by("pk")
    assert (reply.kind, title.kind) == (RequestKind.REPLY, RequestKind.TITLE)
    assert title.turn_id == reply.turn_id and title.status == "done"
    assert Turn.objects.filter(session=session).count() == 1, "the title's request is no turn"
    # the title's request is the next turn's history with one more user message: the task
    title_messages = _messages(scripted.requests[1])
    assert title_messages[-1]["role"] == "user" and prompts.title_task() in title_messages[-1]["content"]
    assert title_messages[-2] == {"role": "assistant", "content": "It greets people."}
    assert json.loads(scripted.requests[1])["max_tokens"] == TITLE_MAX_TOKENS
    assert title.break_cause in ("", BreakCause.NEW_TURN)
    # the next turn finds the whole conversation before its message as the title's request left it
    outcome = run(_loop(scripted_session).send("and main.py?", date="2026-11-29"))
    assert not [event for event in outcome.events if isinstance(event, Titled)], "asked once"
    next_body = scripted.requests[2]
    assert _messages(next_body)[:-1] == title_messages[:-1]
    task_at = scripted.requests[1].rindex(b'"role":"user"')
    conversation_end = scripted.requests[1].rindex(b"{", 0, task_at)  # where the task's message begins
    assert shared_prefix_bytes(scripted.requests[1], next_body) >= conversation_end - 1
    following = ModelRequest.objects.filter(session=session).order_by("pk").last()
    assert following is not None and following.break_cause == BreakCause.NEW_TURN
    assert ChatSession.objects.get(pk=session.pk).title == "Greeting helper"


def test_a_persons_title_is_never_written_over(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    session_rename(session=scripted_session, title="My own name")
    scripted.push(Step(text="Hello."))
    outcome = run(_loop(scripted_session).send("hi"))
    assert not [event for event in outcome.events if isinstance(event, Titled)]
    assert ModelRequest.objects.filter(session=scripted_session, kind=RequestKind.TITLE).count() == 0
    assert ChatSession.objects.get(pk=scripted_session.pk).title == "My own name"
    # a rename while the model writes wins too: the answer finds the person's title and leaves it
    other = ChatSession.objects.get(pk=scripted_session.pk)
    other.title_source = TitleSource.TYPED
    other.save()
    session_rename(session=other, title="Renamed meanwhile")
    assert session_title_by_model(session_id=other.pk, answer="Model's idea") is None
    assert ChatSession.objects.get(pk=other.pk).title == "Renamed meanwhile"


def test_no_title_when_the_first_reply_failed_or_the_answer_is_empty_and_the_first_words_stay(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(fault="http500", text="down"))
    run(_loop(scripted_session).send("hi"))
    typed = ChatSession.objects.get(pk=scripted_session.pk).title
    assert typed == "hi"
    assert ModelRequest.objects.filter(session=scripted_session, kind=RequestKind.TITLE).count() == 0
    scripted.push(Step(text="Hello."), Step(text="   \n"))
    run(_loop(scripted_session).regenerate())
    # a regenerated first reply is still the first: asked once, and an empty answer changes nothing
    assert ModelRequest.objects.filter(session=scripted_session, kind=RequestKind.TITLE).count() == 1
    session = ChatSession.objects.get(pk=scripted_session.pk)
    assert (session.title, session.title_source) == (typed, TitleSource.TYPED)


def test_a_server_error_on_the_title_leaves_the_reply_and_the_session_as_they_were(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="Hello."), Step(fault="http500", text="down"))
    outcome = run(_loop(scripted_session).send("hi"))
    assert outcome.turn.status == "done" and outcome.turn.reply_text == "Hello."
    title = ModelRequest.objects.get(session=scripted_session, kind=RequestKind.TITLE)
    assert title.status == "failed"
    assert ChatSession.objects.get(pk=scripted_session.pk).title_source == TitleSource.TYPED


def test_titles_off_sends_nothing_more(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    scripted.push(Step(text="Hello."))
    run(ReplyLoop(ChatSession.objects.get(pk=scripted_session.pk), client_timeouts=FAST, titles=False).send("hi"))
    assert len(scripted.requests) == 1


def test_the_wire_carries_the_title_and_the_chart_marks_the_request_as_its_own_cause(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="Hello."), Step(text="Small talk"))
    outcome = run(_loop(scripted_session).send("hi"))
    titled = next(event for event in outcome.events if isinstance(event, Titled))
    message = wire.checked(wire.event_message(scripted_session.pk, titled))
    assert (message["event"], message["title"]) == ("titled", "Small talk")
    request = ModelRequest.objects.get(session=scripted_session, kind=RequestKind.TITLE)
    html = bar_html(Bar(2, request, None), window=100_000, auto_at=0.8)
    assert 'data-cause="title"' in html and ">N</span>" in html and "title (the model names the session)" in html


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ('**Title: "Fixing the greet function."**', "Fixing the greet function"),
        ("# Greet refactor\nMore words the model added.", "Greet refactor"),
        ("“Deploying on a LAN box”", "Deploying on a LAN box"),
        ("", ""),
        ("word " * 40, ("word " * 15).strip() + "…"),
    ],
)
def test_a_title_is_the_answers_first_line_without_marks(answer: str, title: str) -> None:
    assert title_from_answer(answer) == title
