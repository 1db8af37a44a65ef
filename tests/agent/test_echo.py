"""What a terminal following a job prints of each event it hears: the streamed text as it comes, a line per tool
call and result, what the asker is told (information on standard output, warnings and errors on standard error),
nothing for the rest."""

from __future__ import annotations

from chat import wire
from chat.agent.echo import echo_lines, result_line


def test_streamed_text_is_printed_as_it_comes_and_reasoning_is_not() -> None:
    text = wire.delta_message(1, turn=3, step=1, text="Hel", at=0, reasoning=False)
    assert echo_lines(text) == [{"err": False, "text": "Hel", "ending": ""}]
    thought = wire.delta_message(1, turn=3, step=1, text="hmm", at=0, reasoning=True)
    assert echo_lines(thought) == []


def test_tool_calls_and_results_get_a_line_each() -> None:
    called = {"type": wire.EVENT, "event": "tool_called", "session": 1, "turn": 3, "step": 1, "name": "read"}
    assert echo_lines(called) == [{"err": False, "text": "\n[read]", "ending": ""}]
    stored = {"type": wire.EVENT, "event": "result_stored", "session": 1, "result": 5, "revision": 4}
    first = result_line("[read a.py: 3 lines]\n1 x\n2 y")
    assert echo_lines(stored, result_line=first) == [{"err": False, "text": "\n  [read a.py: 3 lines]", "ending": "\n"}]


def test_information_goes_to_standard_output_and_warnings_to_standard_error_with_their_lines() -> None:
    told = wire.notice_message(1, text="Took back turn 2.", level="info")
    assert echo_lines(told) == [{"err": False, "text": "Took back turn 2.", "ending": "\n"}]
    warned = wire.notice_message(1, text="Not restored:", level="warning", lines=["a.py changed since"])
    assert echo_lines(warned) == [
        {"err": True, "text": "Not restored:", "ending": "\n"},
        {"err": True, "text": "  a.py changed since", "ending": "\n"},
    ]


def test_a_turn_that_ends_ends_its_line_and_the_rest_prints_nothing() -> None:
    assert echo_lines(wire.turn_ended_message(1, turn=3, revision=2)) == [{"err": False, "text": "", "ending": "\n"}]
    assert echo_lines(wire.job_message(1, state="running", label="Replying…", job=4)) == []
