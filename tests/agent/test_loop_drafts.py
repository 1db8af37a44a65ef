"""While a step streams, what it has said so far is in the store at least every second, so a crash loses at
most a second of it; the stored step replaces the draft."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections

from chat.agent import loop as loop_module
from chat.agent.events import ReplyEvent, TextDelta
from chat.agent.loop import DRAFT_SECONDS, ReplyLoop
from sessions_app.models import ChatSession, StepDraft, TurnStatus
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run
from tests.clock import Clock

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "".join(f"word{n} " for n in range(60))


def test_the_streamed_text_is_saved_as_it_streams(
    scripted_session: ChatSession, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(loop_module, "time", clock)  # the loop's clock: a second passes when the test says so
    scripted.push(Step(text=TEXT, chunk_size=6, delay=0.01))  # pieces apart: a read takes what has arrived
    streamed = at_the_second = ""
    deltas = 0
    saved: list[tuple[str, str]] = []  # (what had streamed a second after the stream began, the draft then)

    def watch(event: ReplyEvent) -> None:
        nonlocal streamed, deltas, at_the_second
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 4:  # a second after the first save of nothing: this delta's text goes in the next save
                clock.advance(DRAFT_SECONDS)
                at_the_second = streamed + event.text
            elif deltas == 5:
                draft = StepDraft.objects.filter(turn__session=scripted_session, number=1).first()
                saved.append((at_the_second, draft.text if draft is not None else ""))
            streamed += event.text

    run(ReplyLoop(scripted_session).send("talk slowly"), each=watch)
    assert saved, "the stream had more than five pieces"
    at_the_second, draft_text = saved[0]
    assert draft_text == at_the_second, "the draft is what had streamed once a second passed"
    turn = scripted_session.turns.get()
    assert turn.status == TurnStatus.DONE and turn.reply_text == TEXT
    assert not StepDraft.objects.filter(turn=turn).exists(), "the stored step replaced its draft"


def test_a_database_lost_mid_reply_ends_the_turn_interrupted_with_what_had_streamed(
    scripted_session: ChatSession, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply's connection is cut (as a Postgres restart cuts it) after a draft was saved: the next write
    fails, the loop connects again and ends the turn interrupted, the draft's text kept as its reply."""
    clock = Clock()
    monkeypatch.setattr(loop_module, "time", clock)
    scripted.push(Step(text=TEXT, chunk_size=6, delay=0.01))  # pieces apart: a read takes what has arrived
    deltas = 0
    drafts: list[str] = []

    def cut(event: ReplyEvent) -> None:
        nonlocal deltas
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 4:
                clock.advance(DRAFT_SECONDS)  # the next piece saves the draft
            elif deltas == 6:
                drafts.append(StepDraft.objects.get(turn__session=scripted_session, number=1).text)
                assert drafts[0]
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    (pid,) = cursor.fetchone()
                with _another_connection() as other:
                    other.execute("SELECT pg_terminate_backend(%s)", [pid])
                clock.advance(DRAFT_SECONDS)  # the next save finds the connection gone

    run(ReplyLoop(scripted_session).send("talk slowly"), each=cut)
    turn = scripted_session.turns.get()
    assert turn.status == TurnStatus.INTERRUPTED
    assert turn.error == loop_module.DATABASE_LOST
    assert turn.reply_text.startswith(drafts[0]), "what had been saved as it streamed is the reply's text"
    assert not StepDraft.objects.filter(turn=turn).exists()


@contextlib.contextmanager
def _another_connection() -> Iterator[Any]:
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other, other.cursor() as cursor:
        yield cursor
