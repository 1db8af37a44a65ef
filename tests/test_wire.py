"""The typed events on the wire: each type has a schema, every event the reply loop yields becomes a message of
its schema, and a message that is not (a field missing, extra or of another type) is refused on both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat import wire
from chat.agent.events import BranchFlipped, Notice, ReasoningDelta, RequestFinished, TextDelta
from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession
from sessions_app.selectors.requests import finished_requests, last_time_to_first_token
from sessions_app.selectors.totals import session_totals
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

GOOD: dict[str, dict[str, Any]] = {
    "turn_started": {"turn": 1, "number": 2, "revision": 3, "again": False},
    "request_started": {"request": 1, "kind": "reply"},
    "text": {"turn": 1, "step": 1, "text": "Hel", "at": 0},
    "reasoning": {"turn": 1, "step": 1, "text": "hm", "at": 4},
    "tool_called": {"turn": 1, "step": 1, "name": "read"},
    "request_finished": {
        "request": 1,
        "bar": 3,
        "previous_ttft": 0.25,
        "totals_requests": 3,
        "totals_prompt_tokens": 4000,
        "totals_cached_tokens": 3500,
        "totals_prompt_seconds": 1.5,
        "totals_timed_tokens": 500,
        "totals_timed_seconds": 0.5,
    },
    "cache_checked": {"request": 1, "bar": 3, "previous_ttft": None},
    "step_stored": {"step": 1, "revision": 2},
    "result_stored": {"result": 1, "revision": 2},
    "turn_ended": {"turn": 1, "revision": 2},
    "turns_taken_back": {"numbers": [3, 2], "compactions": [], "revision": 5},
    "branch_flipped": {"made_live": [2], "revision": 6},
    "compacted": {"generation": 2, "revision": 7},
    "titled": {"title": "Greeting helper"},
    "notice": {"text": "Took back turn 2.", "level": "info", "lines": []},
    "job": {"state": "running", "label": "Replying…", "job": 12},
    "words_back": {"words": "my words"},
    "live": {"turn": 1, "step": 2, "text": "so far", "reasoning": "", "calls": ["read"]},
    "job_ended": {"job": 12, "failure": "", "requests": [1, 2], "turn": None},
    "mode_set": {"mode": "plan"},
    "model_changed": {"revision": 8},
}


def _event(event_name: str, /, **fields: Any) -> dict[str, Any]:
    return {"type": wire.EVENT, "event": event_name, "session": 9, **fields}


def test_every_event_type_has_a_schema_and_an_example_here() -> None:
    assert set(GOOD) == set(wire.SCHEMAS)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_an_event_of_its_schema_passes_and_one_that_is_not_is_refused(name: str) -> None:
    good = _event(name, **GOOD[name])
    assert wire.checked(good) is good
    for field, value in GOOD[name].items():
        missing = {key: item for key, item in good.items() if key != field}
        with pytest.raises(wire.WireError, match="fields"):
            wire.checked(missing)
        wrong = {**good, field: object()}
        with pytest.raises(wire.WireError):
            wire.checked(wrong)
        if isinstance(value, int) and not isinstance(value, bool):
            with pytest.raises(wire.WireError):
                wire.checked({**good, field: True})
    with pytest.raises(wire.WireError, match="fields"):
        wire.checked({**good, "extra": 1})
    stamped = wire.stamped(good)
    assert wire.checked(stamped) is stamped and isinstance(stamped[wire.SENT], float), "sent as it goes out"
    with pytest.raises(wire.WireError, match="not a time"):
        wire.checked({**good, wire.SENT: "now"})


def test_what_is_no_event_is_refused() -> None:
    with pytest.raises(wire.WireError, match="not an event"):
        wire.checked({"type": "cachet.message", "text": "{}"})
    with pytest.raises(wire.WireError, match="no such event"):
        wire.checked(_event("unknown"))
    with pytest.raises(wire.WireError, match="no session"):
        wire.checked({**_event("request_finished", **GOOD["request_finished"]), "session": "9"})
    with pytest.raises(wire.WireError, match=r"job\.state"):
        wire.checked(_event("job", state="lost", label="", job=1))
    with pytest.raises(wire.WireError, match=r"notice\.level"):
        wire.checked(_event("notice", text="x", level="loud", lines=[]))
    with pytest.raises(wire.WireError, match="list of int"):
        wire.checked(_event("turns_taken_back", numbers=[1, "2"], compactions=[], revision=1))


@pytest.mark.django_db(transaction=True)
def test_every_event_of_a_reply_becomes_a_message_of_its_schema(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(text="Reading.", reasoning="Look.", tool_calls=[("read", {"path": "a.py"})]), Step(text="Done."))
    sent = run(ReplyLoop(scripted_session).send("read it")).events
    scripted.push(Step(text="Again."))
    sent += run(ReplyLoop(scripted_session).regenerate()).events
    sent += run(ReplyLoop(scripted_session).undo()).events
    names = set()
    for event in sent:
        if isinstance(event, TextDelta | ReasoningDelta):
            continue  # a worker sends a delta with its offset (``delta_message``)
        message = wire.checked(wire.event_message(scripted_session.pk, event))
        names.add(message["event"])
    assert names >= {"turn_started", "request_started", "tool_called", "request_finished", "step_stored"}
    assert names >= {"result_stored", "turn_ended", "turns_taken_back"}
    assert wire.checked(wire.event_message(1, Notice("careful", level="warning", lines=("a",))))["lines"] == ["a"]
    assert wire.checked(wire.event_message(1, BranchFlipped(taken_back=(), made_live=())))["made_live"] == []


@pytest.mark.django_db(transaction=True)
def test_a_finished_requests_bar_and_totals_are_what_the_store_gives(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    """Each request's bar number and the totals after it travel with its event (a web process shows them without a
    query over the session): they are what the chart read from the store gives, a second action's included."""
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "a.py"})]),
        Step(text="Done."),
        Step(text="Again."),
    )
    events = run(ReplyLoop(scripted_session).send("read it")).events
    events += run(ReplyLoop(scripted_session).send("once more")).events
    finished = [event for event in events if isinstance(event, RequestFinished)]
    assert len(finished) == 3
    for event in finished:
        message = wire.checked(wire.event_message(scripted_session.pk, event))
        before = finished_requests(session=scripted_session).filter(id__lte=event.request.pk)
        assert message["bar"] == before.count()
        assert message["previous_ttft"] == last_time_to_first_token(before.filter(id__lt=event.request.pk))
    assert finished[-1].totals == session_totals(scripted_session)
    assert finished[-1].totals.requests == 3 and finished[-1].totals.cached_tokens > 0
