"""A compaction inside a reply: the rest of the reply, and every later request of the new generation, send the
turn's message with the full note; the message stored with the turn, which the requests before sent, stays."""

from __future__ import annotations

import pytest

from sessions_app import prompts
from sessions_app.hygiene import StatedContext
from sessions_app.models import RESUMED_FIELDS, ChatSession, Generation, ModelEndpoint, Turn
from sessions_app.selectors.requests import build_request
from sessions_app.selectors.sessions import current_generation
from sessions_app.services.compaction import compaction_apply
from sessions_app.services.sessions import session_change_model, session_set_mode
from sessions_app.services.turns import stated_context, step_record, turn_finish, turn_start
from sessions_app.services.undo import turn_regenerate, turn_undo

pytestmark = pytest.mark.django_db(transaction=True)

DAY, NEXT_DAY = "2026-11-30", "2026-12-01"


def _session(chat_session: ChatSession) -> ChatSession:
    return ChatSession.objects.select_related("workspace").get(pk=chat_session.pk)


def _done(session: ChatSession, words: str, *, today: str = DAY, instructions: str | None = None) -> Turn:
    turn = turn_start(session=session, words=words, today=today, instructions=instructions)
    step_record(turn=turn, number=1, text=f"re: {words}", reasoning="", tool_calls=[], finish_reason="stop")
    return turn_finish(turn=turn)


def _full_note(words: str, *, mode: str, today: str, instructions: str | None) -> str:
    items = [
        'Workspace: "ws".',
        "Your model: scripted.",
        f"The permission mode is {mode}: {prompts.mode_text(mode).strip()}",
        f"Date: {today}.",
    ]
    if instructions:
        items.append(f"The workspace's instructions (AGENTS.md) are now:\n{instructions}")
    return words + "\n\n<note>\n" + "\n\n".join(items) + "\n</note>"


def _user_messages(session: ChatSession, current: Turn | None) -> list[str]:
    built = build_request(ChatSession.objects.get(pk=session.pk), current=current, model_name="scripted")
    return [message["content"] for message in built.messages if message["role"] == "user"]


def test_the_rest_of_the_reply_sends_its_message_with_the_full_note_and_the_stored_one_stays(
    chat_session: ChatSession,
) -> None:
    _done(_session(chat_session), "one", instructions="Be brief.")
    session = session_set_mode(session=_session(chat_session), mode="plan")
    turn = turn_start(session=_session(session), words="two", today=DAY, instructions="Be brief.")
    stored = turn.message
    assert (
        stored == "two\n\n<note>\nThe permission mode is now plan: " + prompts.mode_text("plan").strip() + "\n</note>"
    )
    step_record(turn=turn, number=1, text="", reasoning="", tool_calls=[], finish_reason="tool_calls")
    before = _user_messages(session, turn)
    assert before[-1] == stored

    generation = compaction_apply(
        session=session, summary="We talked.", within=turn, after_step=1, today=NEXT_DAY, instructions="Be brief."
    )

    resumed = _full_note("two", mode="plan", today=NEXT_DAY, instructions="Be brief.")
    assert generation.resumed_turn == turn.number and generation.resumed_message == resumed
    assert _user_messages(session, turn) == [resumed], "the rest of the reply: its message with the full note"
    assert Turn.objects.get(pk=turn.pk).message == stored, "what the requests before sent is kept as it was"
    assert stated_context(_session(session), generation=generation) == StatedContext(
        workspace="ws", model="scripted", mode="plan", date=NEXT_DAY, instructions="Be brief."
    )

    turn_finish(turn=turn)
    later = turn_start(session=_session(session), words="three", today=NEXT_DAY, instructions="Be brief.")
    assert later.message == "three", "nothing changed since the full note: the next message notes nothing"
    assert _user_messages(session, later) == [resumed, "three"], "later requests send the resumed message too"


def test_a_compaction_of_the_turns_before_a_running_reply_resumes_the_whole_turn(chat_session: ChatSession) -> None:
    _done(_session(chat_session), "one")
    _done(_session(chat_session), "two")
    turn = turn_start(session=_session(chat_session), words="three", today=DAY, instructions=None)
    assert turn.message == "three"

    generation = compaction_apply(session=_session(chat_session), summary="Two turns.", within=turn, today=DAY)

    assert (generation.covers_through_turn, generation.resumes_after_step, generation.resumed_turn) == (2, None, 3)
    assert _user_messages(chat_session, turn) == [_full_note("three", mode="edit", today=DAY, instructions=None)]


def test_a_regenerated_resumed_turn_asks_again_with_the_message_as_the_generation_sent_it(
    chat_session: ChatSession,
) -> None:
    _done(_session(chat_session), "one")
    turn = turn_start(session=_session(chat_session), words="two", today=DAY, instructions=None)
    generation = compaction_apply(session=_session(chat_session), summary="One.", within=turn, today=DAY)
    turn_finish(turn=turn)

    _, again = turn_regenerate(session=_session(chat_session))

    assert again.message == generation.resumed_message and again.note_date == DAY and again.note_mode == "edit"
    assert _user_messages(chat_session, again) == [generation.resumed_message]
    turn_finish(turn=again)
    assert turn_start(session=_session(chat_session), words="three", today=DAY, instructions=None).message == "three"


def test_once_the_resumed_turn_is_taken_back_the_next_message_carries_the_full_note(
    chat_session: ChatSession,
) -> None:
    _done(_session(chat_session), "one")
    turn = turn_start(session=_session(chat_session), words="two", today=DAY, instructions=None)
    compaction_apply(session=_session(chat_session), summary="One.", within=turn, today=DAY)
    turn_finish(turn=turn)

    turn_undo(session=_session(chat_session))  # the compaction covers turn 1 only: it stays

    assert current_generation(_session(chat_session)).number == 2
    fresh = turn_start(session=_session(chat_session), words="three", today=DAY, instructions=None)
    assert fresh.message == _full_note("three", mode="edit", today=DAY, instructions=None)


def test_a_change_of_model_keeps_sending_the_resumed_message(chat_session: ChatSession) -> None:
    _done(_session(chat_session), "one")
    turn = turn_start(session=_session(chat_session), words="two", today=DAY, instructions=None)
    compaction = compaction_apply(session=_session(chat_session), summary="One.", within=turn, today=DAY)
    turn_finish(turn=turn)

    other = ModelEndpoint.objects.create(name="other", base_url="http://127.0.0.1:9/v1", model="bigger")
    session = session_change_model(session=_session(chat_session), endpoint=other, model_name="bigger")

    moved = Generation.objects.get(session=session, number=session.generation_number)
    assert [getattr(moved, name) for name in RESUMED_FIELDS] == [getattr(compaction, name) for name in RESUMED_FIELDS]
    assert _user_messages(session, None) == [compaction.resumed_message]
    later = turn_start(session=_session(session), words="three", today=DAY, instructions=None)
    assert later.message == "three\n\n<note>\nYour model: bigger.\n</note>"


def test_a_compaction_inside_a_reply_needs_the_date_its_note_states(chat_session: ChatSession) -> None:
    _done(_session(chat_session), "one")
    turn = turn_start(session=_session(chat_session), words="two", today=DAY, instructions=None)
    with pytest.raises(ValueError, match="the date its note states"):
        compaction_apply(session=_session(chat_session), summary="One.", within=turn)
    assert Generation.objects.filter(session=chat_session).count() == 1
