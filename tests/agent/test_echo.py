"""What a terminal following a job prints of each event: the streamed text as it comes, a line per tool call
and result, notices on standard error, nothing for the rest."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from chat.agent.echo import echo_lines
from chat.agent.events import Notice, ReasoningDelta, ResultStored, TextDelta, ToolCalled, TurnEnded


def test_streamed_text_is_printed_as_it_comes_and_a_summary_is_not() -> None:
    assert echo_lines(TextDelta(turn_number=3, step=1, text="Hel")) == [{"err": False, "text": "Hel", "ending": ""}]
    assert echo_lines(TextDelta(turn_number=0, step=1, text="summary")) == []
    assert echo_lines(ReasoningDelta(turn_number=3, step=1, text="hmm")) == []


def test_tool_calls_and_results_get_a_line_each() -> None:
    assert echo_lines(ToolCalled(turn_number=3, step=1, name="read")) == [
        {"err": False, "text": "\n[read]", "ending": ""}
    ]
    result: Any = SimpleNamespace(inserted_text="[read a.py: 3 lines]\n1 x\n2 y")
    assert echo_lines(ResultStored(result=result, revision=4)) == [
        {"err": False, "text": "\n  [read a.py: 3 lines]", "ending": "\n"}
    ]


def test_notices_go_to_standard_error_with_their_lines() -> None:
    notice = Notice(text="Not restored:", level="error", lines=("a.py changed since",))
    assert echo_lines(notice) == [
        {"err": True, "text": "Not restored:", "ending": "\n"},
        {"err": True, "text": "  a.py changed since", "ending": "\n"},
    ]


def test_a_turn_that_ends_ends_its_line() -> None:
    turn: Any = SimpleNamespace(number=3)
    assert echo_lines(TurnEnded(turn=turn)) == [{"err": False, "text": "", "ending": "\n"}]
