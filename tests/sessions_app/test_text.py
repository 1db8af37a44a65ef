"""One text rule for everything stored: NUL → ␀, a lone surrogate → U+FFFD, so no turn fails for either."""

from __future__ import annotations

import json

import pytest

from sessions_app.hygiene.outcomes import EditOutcome, FileChange, OutputOutcome, ReadOutcome
from sessions_app.models import ChatSession, ModelRequest, Result, Step, Turn, TurnStatus
from sessions_app.selectors.requests import build_request
from sessions_app.services.compaction import compaction_apply
from sessions_app.services.requests import request_record_finish
from sessions_app.services.results import result_insert
from sessions_app.services.sessions import session_rename
from sessions_app.services.turns import step_record, turn_fail, turn_finish, turn_start
from sessions_app.text import NUL_STANDIN, storable, storable_json
from tests.sessions_app.store_kit import request_recorded

TODAY = "2026-11-29"


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("plain text, ünïcode and 😀", "plain text, ünïcode and 😀"),
        ("a\x00b\x00", "a\u2400b\u2400"),
        ("high \ud800 alone", "high \ufffd alone"),
        ("low \udfff alone", "low \ufffd alone"),
        ("\ud83d", "\ufffd"),
        ("split pair \ud83d" + "\ude00 joined", "split pair 😀 joined"),
        ("a file name from the disk \udcff", "a file name from the disk \ufffd"),
        ("\x00\ud800", "\u2400\ufffd"),
    ],
)
def test_storable(given: str, stored: str) -> None:
    assert storable(given) == stored
    assert storable(stored) == stored
    stored.encode("utf-8")


def test_storable_json_reaches_keys_values_and_numbers() -> None:
    value = {"pa\x00th": ["\ud800", {"k\udfff": "v"}], "n": 3, "f": float("nan"), "i": float("-inf"), "t": True}
    assert storable_json(value) == {
        f"pa{NUL_STANDIN}th": ["\ufffd", {"k\ufffd": "v"}],
        "n": 3,
        "f": "NaN",
        "i": "-Infinity",
        "t": True,
    }


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_first_message_with_bad_text_is_stored_with_its_title(chat_session: ChatSession, bad: str) -> None:
    words = f"fix{bad} the {bad}build"
    turn = turn_start(session=chat_session, words=words, today=TODAY, instructions=f"Be brief{bad}.")
    turn.refresh_from_db()
    assert turn.status == TurnStatus.OPEN
    assert turn.words == storable(words) and bad not in turn.words
    assert turn.words.startswith("fix") and turn.words.endswith("build")
    assert storable(words) in turn.message and bad not in turn.message
    assert turn.note_instructions == storable(f"Be brief{bad}.")
    chat_session.refresh_from_db()
    assert chat_session.title == storable(words)
    built = build_request(chat_session, current=turn, model_name="scripted")
    assert storable(words) in built.body.decode("utf-8")


@pytest.mark.django_db
def test_the_same_instructions_are_not_noted_twice(chat_session: ChatSession) -> None:
    first = turn_start(session=chat_session, words="one", today=TODAY, instructions="Be \ud800 brief.")
    turn_finish(turn=first)
    second = turn_start(session=chat_session, words="two", today=TODAY, instructions="Be \ud800 brief.")
    assert first.note_instructions == "Be \ufffd brief."
    assert second.note_instructions is None


@pytest.mark.django_db
def test_a_renamed_title_with_bad_text_is_stored(chat_session: ChatSession) -> None:
    session_rename(session=chat_session, title="a\x00b\udc80c")
    chat_session.refresh_from_db()
    assert chat_session.title == "a\u2400b\ufffdc"


@pytest.mark.django_db
def test_model_text_with_lone_surrogates_is_stored_and_sent_back(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="go", today=TODAY, instructions=None)
    step = step_record(
        turn=turn,
        number=1,
        text="half an emoji \ud83d",
        reasoning="thinking \udfff",
        tool_calls=[{"id": "call\ud800", "name": "re\x00ad", "arguments": '{"path": "a\\ud800"}\ud800'}],
        finish_reason="tool_calls\x00",
    )
    step = Step.objects.get(pk=step.pk)
    assert step.text == "half an emoji \ufffd"
    assert step.reasoning == "thinking \ufffd"
    assert step.tool_calls == [{"id": "call\ufffd", "name": "re\u2400ad", "arguments": '{"path": "a\\ud800"}\ufffd'}]
    assert step.finish_reason == "tool_calls\u2400"
    body = build_request(chat_session, current=turn, model_name="scripted").body
    sent = json.loads(body)["messages"][-1]
    assert sent["content"] == "half an emoji \ufffd"
    assert sent["tool_calls"][0]["id"] == "call\ufffd"
    finished = turn_finish(turn=turn, unstored="more \ud83d")
    assert Turn.objects.get(pk=finished.pk).reply_text == "half an emoji \ufffd\n\nmore \ufffd"


@pytest.mark.django_db
def test_a_failed_turn_keeps_its_error_and_partial_text(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="go", today=TODAY, instructions=None)
    turn_fail(turn=turn, error="server said \ud800\x00", unstored="part \udbff")
    turn.refresh_from_db()
    assert (turn.status, turn.error, turn.reply_text) == (TurnStatus.FAILED, "server said \ufffd\u2400", "part \ufffd")


@pytest.mark.django_db
def test_results_with_bad_text_paths_and_arguments_are_stored(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="go", today=TODAY, instructions=None)
    output = result_insert(
        turn=turn,
        step=None,
        call_id="c\ud800",
        tool="run",
        arguments={"comm\udfffand": "echo \x00", "timeout": float("inf")},
        arguments_raw='{"command": "echo \\u0000"}\x00',
        outcome=OutputOutcome(text="bytes \ud800 and \x00 from a command"),
    )
    read = result_insert(
        turn=turn,
        step=None,
        call_id="c2",
        tool="read",
        arguments={"path": "n\udcffame.txt"},
        arguments_raw="{}",
        outcome=ReadOutcome(
            path="n\udcffame.txt",
            abs_path="/ws/n\udcffame.txt",
            offset=1,
            limit=2000,
            first_line=1,
            last_line=1,
            total_lines=1,
            sha256="0" * 64,
            body="1: caf\udce9",
        ),
    )
    edit = result_insert(
        turn=turn,
        step=None,
        call_id="c3",
        tool="write",
        arguments={"path": "\udcff.md", "content": "x"},
        arguments_raw="{}",
        outcome=EditOutcome(
            changes=(FileChange(path="\udcff.md", abs_path="/ws/\udcff.md", action="create", sha256="1" * 64, lines=1),)
        ),
    )
    output = Result.objects.get(pk=output.pk)
    assert output.call_id == "c\ufffd"
    assert output.arguments == {"comm\ufffdand": f"echo {NUL_STANDIN}", "timeout": "Infinity"}
    assert output.arguments_raw == '{"command": "echo \\u0000"}\u2400'
    assert output.full_text == f"bytes \ufffd and {NUL_STANDIN} from a command"
    assert "bytes \ufffd and" in output.inserted_text
    read = Result.objects.get(pk=read.pk)
    assert (read.path, read.abs_path) == ("n\ufffdame.txt", "/ws/n\ufffdame.txt")
    assert "caf\ufffd" in read.full_text and "\ufffd" in read.inserted_text
    edit = Result.objects.get(pk=edit.pk)
    assert edit.path == "\ufffd.md" and edit.changed_files[0]["abs_path"] == "/ws/\ufffd.md"


@pytest.mark.django_db
def test_request_errors_usage_and_summaries_are_stored(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="go", today=TODAY, instructions=None)
    request, _ = request_recorded(chat_session, turn, model_name="scripted")
    request_record_finish(
        request=request,
        prompt_tokens=None,
        cached_tokens=None,
        completion_tokens=None,
        time_to_first_token=None,
        total_time=None,
        usage={"no\x00te": "\ud800"},
        timings=None,
        error="The model server said: bad \ud800 byte \x00",
    )
    stored = ModelRequest.objects.get(pk=request.pk)
    assert stored.error == "The model server said: bad \ufffd byte \u2400"
    assert stored.usage == {"no\u2400te": "\ufffd"}
    turn_finish(turn=turn)
    generation = compaction_apply(session=chat_session, summary="We fixed \ud83d the \x00 build.")
    assert generation.summary == "We fixed \ufffd the \u2400 build."
    assert "We fixed \ufffd the \u2400 build." in generation.system_prompt
    chat_session.refresh_from_db()
    build_request(chat_session, current=None, model_name="scripted").body.decode("utf-8")
