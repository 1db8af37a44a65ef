"""What the loop waits on outside the process (the model's answer, a tool) happens inside ``waiting``; its own
work (storing the turn, the steps and the results) outside it, where a web process serializes it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chat.agent import loop as loop_module
from chat.agent.events import RequestStarted, ResultStored, StepStored, TextDelta, ToolCalled, TurnEnded, TurnStarted
from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, TurnStatus
from testing.scripted_server import ScriptedServer, Step

pytestmark = pytest.mark.django_db(transaction=True)


class Away:
    """A ``waiting`` that notes whether the loop is inside it."""

    def __init__(self) -> None:
        self.inside = False
        self.entered = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        assert not self.inside, "waits do not nest"
        self.inside, self.entered = True, self.entered + 1
        try:
            yield
        finally:
            self.inside = False


def test_the_model_and_the_tools_are_waited_on_inside_and_the_store_is_written_outside(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]))
    scripted.push(Step(text="It prints a.", chunk_size=3))
    away = Away()
    seen: dict[str, list[bool]] = {}

    def noted(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, []).append(away.inside)
            return function(*args, **kwargs)

        return call

    for name in ("call_tool", "step_record", "turn_start", "turn_finish", "request_record_start"):
        monkeypatch.setattr(loop_module, name, noted(name, getattr(loop_module, name)))

    events: dict[str, list[bool]] = {}
    for event in ReplyLoop(scripted_session, waiting=away).send("what does a.py print?"):
        events.setdefault(type(event).__name__, []).append(away.inside)

    assert seen == {
        "turn_start": [False],
        "request_record_start": [False, False],
        "call_tool": [True],
        "step_record": [False, False],
        "turn_finish": [False],
    }
    for streamed in (TextDelta, ToolCalled, RequestStarted):
        assert set(events[streamed.__name__]) == {True}, streamed
    assert events[TurnStarted.__name__] == [False]
    assert events[TurnEnded.__name__] == [False]
    # The step with the call and its result are published once the next request is on its way: while waiting.
    assert events[StepStored.__name__] == [True, False]
    assert events[ResultStored.__name__] == [True]
    assert away.entered == 3  # two requests and one tool call
    assert not away.inside


def test_a_failing_model_leaves_the_wait_before_the_failure_is_recorded(
    scripted_session: ChatSession, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.push(Step(text="half of it", fault="cut"))
    away = Away()
    finished_inside: list[bool] = []
    plain = getattr(loop_module, "request_record_finish")  # noqa: B009 (not exported; replaced below)

    def noted(**kwargs: Any) -> Any:
        finished_inside.append(away.inside)
        return plain(**kwargs)

    monkeypatch.setattr(loop_module, "request_record_finish", noted)
    ended = [event for event in ReplyLoop(scripted_session, waiting=away).send("hello") if isinstance(event, TurnEnded)]
    assert ended[0].turn.status == TurnStatus.FAILED
    assert finished_inside == [False]
    assert not away.inside
