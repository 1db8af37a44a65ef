"""While a step streams, what it has said so far is in the store at least every second, so a crash loses at
most a second of it; the stored step replaces the draft."""

from __future__ import annotations

import pytest

from chat.agent import loop as loop_module
from chat.agent.events import TextDelta
from chat.agent.loop import DRAFT_SECONDS, ReplyLoop
from sessions_app.models import ChatSession, StepDraft, TurnStatus
from testing.scripted_server import ScriptedServer, Step
from tests.clock import Clock

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "".join(f"word{n} " for n in range(60))


def test_the_streamed_text_is_saved_as_it_streams(
    scripted_session: ChatSession, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(loop_module, "time", clock)  # the loop's clock: a second passes when the test says so
    scripted.push(Step(text=TEXT, chunk_size=6))
    streamed = ""
    deltas = 0
    saved: list[tuple[str, str]] = []  # (what had streamed a second after the stream began, the draft then)
    for event in ReplyLoop(scripted_session).send("talk slowly"):
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 4:  # a second after the first save of nothing: this delta's text goes in the next save
                clock.advance(DRAFT_SECONDS)
                at_the_second = streamed + event.text
            elif deltas == 5:
                draft = StepDraft.objects.filter(turn__session=scripted_session, number=1).first()
                saved.append((at_the_second, draft.text if draft is not None else ""))
            streamed += event.text
    assert saved, "the stream had more than five pieces"
    at_the_second, draft_text = saved[0]
    assert draft_text == at_the_second, "the draft is what had streamed once a second passed"
    turn = scripted_session.turns.get()
    assert turn.status == TurnStatus.DONE and turn.reply_text == TEXT
    assert not StepDraft.objects.filter(turn=turn).exists(), "the stored step replaced its draft"
