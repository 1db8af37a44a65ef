"""While a step streams, what it has said so far is in the store at least every second, so a crash loses at
most a second of it; the stored step replaces the draft."""

from __future__ import annotations

import time

import pytest

from chat.agent.events import TextDelta
from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, StepDraft, TurnStatus
from testing.scripted_server import ScriptedServer, Step

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "".join(f"word{n} " for n in range(60))


def test_the_streamed_text_is_saved_as_it_streams(scripted_session: ChatSession, scripted: ScriptedServer) -> None:
    scripted.push(Step(text=TEXT, chunk_size=6, delay=0.05))
    streamed = ""
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    action = ReplyLoop(scripted_session).send("talk slowly")
    for event in action:
        if isinstance(event, TextDelta):
            streamed += event.text
            if time.monotonic() - started > 1.5 and not seen:
                draft = StepDraft.objects.filter(turn__session=scripted_session, number=1).first()
                seen.append((time.monotonic() - started, draft.text if draft is not None else ""))
                saved_behind = len(streamed) - len(seen[0][1])
    assert seen, "the stream lasted over 1.5 s"
    _, draft_text = seen[0]
    assert draft_text and streamed.startswith(draft_text), "the draft is what had streamed"
    assert saved_behind <= len(TEXT) * 0.5, "at most about a second behind"
    turn = scripted_session.turns.get()
    assert turn.status == TurnStatus.DONE and turn.reply_text == TEXT
    assert not StepDraft.objects.filter(turn=turn).exists(), "the stored step replaced its draft"
