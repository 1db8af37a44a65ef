"""Requests that always fit: against a scripted server with a small context that refuses oversize requests as
llama.cpp does, every request the loop sends fits, compacting first where it must."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chat.agent.budget import RequestTooLarge
from chat.agent.loop import ReplyLoop, today
from chat.agent.model import Timeouts
from chat.tools import tool_list
from chat.web.display import CompactionView
from chat.web.fragments import compaction_put
from sessions_app.models import (
    BreakCause,
    ChatSession,
    Generation,
    ModelEndpoint,
    ModelRequest,
    RequestKind,
    RequestStatus,
    Turn,
    TurnStatus,
    Workspace,
)
from sessions_app.prompts import mode_text
from sessions_app.services.sessions import session_set_mode, session_start
from sessions_app.services.setup import endpoint_window_record
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)
N_CTX = 8000
FILLER = "word, "  # two tokens of the scripted server's tokenizer, six bytes: about the default bytes per token


@pytest.fixture
def small() -> Iterator[ScriptedServer]:
    with ScriptedServer(n_ctx=N_CTX, when_empty=Step(fault="http500", text="script exhausted")) as server:
        yield server


def _session(user: Any, workspace: Workspace, server: ScriptedServer, *, configured: int) -> ChatSession:
    endpoint = ModelEndpoint.objects.create(
        name="small", base_url=server.base_url, model="scripted", context_window=configured
    )
    return session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tool_list(allow_commands=False)
    )


def _loop(session: ChatSession) -> ReplyLoop:
    return ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST)


def _requests(session: ChatSession) -> list[ModelRequest]:
    return list(ModelRequest.objects.filter(session=session).order_by("id"))


def _all_fit(requests: list[ModelRequest]) -> None:
    assert [r.status for r in requests] == [RequestStatus.DONE] * len(requests), [r.error for r in requests]
    assert all(r.prompt_tokens is not None and r.prompt_tokens < N_CTX for r in requests)


def _turn_past_80_percent_compacts_first(session: ChatSession, server: ScriptedServer) -> None:
    server.push(Step(text="noted"), Step(text="Summary: the person pasted words."), Step(text="fresh"))
    loop = _loop(session)
    first = run(loop.send("keep these: " + FILLER * 2550)).turn
    assert first.status == TurnStatus.DONE
    tokens = _requests(session)[0].prompt_tokens
    assert tokens is not None and 0.8 * N_CTX < tokens < N_CTX - 1024, "the first turn fits, past the threshold"
    second = run(_loop(session).send("next")).turn
    assert second.status == TurnStatus.DONE and second.reply_text == "fresh"
    requests = _requests(session)
    assert [r.kind for r in requests] == [RequestKind.REPLY, RequestKind.COMPACTION, RequestKind.REPLY]
    assert requests[2].break_cause == BreakCause.COMPACTION
    _all_fit(requests)
    assert ChatSession.objects.get(pk=session.pk).generation_number == 2


def test_the_window_is_read_from_the_server_and_a_turn_past_80_percent_compacts_first(
    user: Any, workspace: Workspace, small: ScriptedServer
) -> None:
    session = _session(user, workspace, small, configured=100_000)
    _turn_past_80_percent_compacts_first(session, small)
    assert ModelEndpoint.objects.get(pk=session.endpoint_id).window == N_CTX, "read from /props, not as configured"


def test_a_server_without_props_and_tokenize_falls_back_to_the_configured_window_and_the_estimate(
    user: Any, workspace: Workspace
) -> None:
    with ScriptedServer(n_ctx=N_CTX, server_api=False) as quiet:
        session = _session(user, workspace, quiet, configured=N_CTX)
        _turn_past_80_percent_compacts_first(session, quiet)
    endpoint = ModelEndpoint.objects.get(pk=session.endpoint_id)
    assert (endpoint.server_context_window, endpoint.window) == (None, N_CTX)


def _lines(count: int, word: str) -> str:
    return "".join(f"{word} beta gamma delta\n" for _ in range(count))


def test_a_step_that_would_not_fit_compacts_the_reply_which_goes_on_from_the_summary(
    user: Any, workspace: Workspace, workspace_dir: Path, small: ScriptedServer
) -> None:
    (workspace_dir / "a.txt").write_text(_lines(500, "alpha"))
    (workspace_dir / "b.txt").write_text(_lines(500, "omega"))
    session = _session(user, workspace, small, configured=N_CTX)
    small.push(
        Step(tool_calls=[("read", {"path": "a.txt"})]),
        Step(tool_calls=[("read", {"path": "b.txt"})]),
        Step(text="Summary: a.txt holds alpha lines."),
        Step(text="Both files are read."),
        Step(text="Still here."),
    )
    turn = run(_loop(session).send("read a.txt then b.txt")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    assert turn.reply_text == "Both files are read."
    requests = _requests(session)
    assert [r.kind for r in requests] == [RequestKind.REPLY] * 2 + [RequestKind.COMPACTION, RequestKind.REPLY]
    assert [r.break_cause for r in requests[1:]] == ["", "", BreakCause.COMPACTION]
    _all_fit(requests)
    summary_request = json.loads(small.requests[2])["messages"]
    assert [m["role"] for m in summary_request] == ["system", "user", "assistant", "tool", "user"]
    assert "alpha beta" in summary_request[3]["content"], "the summary request carries the reply's steps"
    went_on = json.loads(small.requests[3])["messages"]
    assert [m["role"] for m in went_on] == ["system", "user", "assistant", "tool"]
    assert "Summary: a.txt holds alpha lines." in went_on[0]["content"]
    assert "| a.txt | 1-500 of 500 |" in went_on[0]["content"], "the table names the read the summary covers"
    assert went_on[1]["content"] == turn.message, "the person's message goes on with the reply"
    assert "omega beta" in went_on[3]["content"] and "alpha beta" not in json.dumps(went_on[1:])
    generation = Generation.objects.get(session=session, number=2)
    assert (generation.covers_through_turn, generation.resumes_after_step) == (turn.number, 1)
    assert turn.steps.count() == 3 and turn.results.count() == 2, "every step and result stays stored"

    later = run(_loop(session).send("and now?")).turn
    assert later.reply_text == "Still here."
    last = json.loads(small.requests[-1])["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user"]
    assert last[2]["content"] == turn.reply_text
    _all_fit(_requests(session))
    shown = compaction_put(CompactionView(generation)).html
    assert f"Compacted while turn {turn.number} ran: the turns before it and its first 1 step are summarized" in shown

    run(_loop(session).undo())
    run(_loop(session).undo())
    assert Generation.objects.get(session=session, number=2).taken_back, "taking the turn back takes its compaction"
    assert ChatSession.objects.get(pk=session.pk).generation_number == 1


def test_after_a_compaction_inside_a_later_reply_its_message_goes_on_with_the_full_note(
    user: Any, workspace: Workspace, workspace_dir: Path, small: ScriptedServer
) -> None:
    """The reply's message as the post-compaction request sends it states the workspace, the model, the mode and
    the date again; the message stored with the turn, which the requests before sent, is not rewritten."""
    (workspace_dir / "a.txt").write_text(_lines(500, "alpha"))
    (workspace_dir / "b.txt").write_text(_lines(500, "omega"))
    session = _session(user, workspace, small, configured=N_CTX)
    small.push(
        Step(text="Hello."),
        Step(tool_calls=[("read", {"path": "a.txt"})]),
        Step(tool_calls=[("read", {"path": "b.txt"})]),
        Step(text="Summary: a.txt holds alpha lines."),
        Step(text="Both files are read."),
        Step(text="Still here."),
    )
    run(_loop(session).send("hi"))
    session_set_mode(session=session, mode="plan")
    turn = run(_loop(session).send("read a.txt then b.txt")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    stored = (
        "read a.txt then b.txt\n\n<note>\nThe permission mode is now plan: " + mode_text("plan").strip() + "\n</note>"
    )
    assert Turn.objects.get(pk=turn.pk).message == stored
    requests = _requests(session)
    assert [r.kind for r in requests] == [RequestKind.REPLY] * 3 + [RequestKind.COMPACTION, RequestKind.REPLY]
    assert json.loads(small.requests[3])["messages"][3]["content"] == stored, "the summary request: as sent before"
    full = (
        'read a.txt then b.txt\n\n<note>\nWorkspace: "ws".\n\nYour model: scripted.\n\n'
        f"The permission mode is plan: {mode_text('plan').strip()}\n\nDate: {today()}.\n</note>"
    )
    went_on = json.loads(small.requests[4])["messages"]
    assert [m["role"] for m in went_on] == ["system", "user", "assistant", "tool"]
    assert went_on[1]["content"] == full

    later = run(_loop(session).send("and now?")).turn
    assert later.message == "and now?", "the full note stated it all: nothing to note"
    last = json.loads(small.requests[-1])["messages"]
    assert [m["content"] for m in last if m["role"] == "user"] == [full, "and now?"]
    _all_fit(_requests(session))


def test_a_request_that_cannot_fit_fails_before_it_is_sent_and_loses_nothing(
    user: Any, workspace: Workspace, small: ScriptedServer
) -> None:
    session = _session(user, workspace, small, configured=N_CTX)
    words = "read this: " + FILLER * 3000
    turn = run(_loop(session).send(words)).turn
    assert turn.status == TurnStatus.FAILED
    assert turn.error.startswith("This request needs ")
    assert re.search(
        f"tokens and room for the answer; the model's context window is {N_CTX:,} tokens, read from the server "
        r"\(llama.cpp /props n_ctx\) at \d\d:\d\d UTC on \d{4}-\d\d-\d\d, "
        r"and compacting cannot make it fit \(the summary is asked with the conversation as it is\)\. "
        r"Use a model with a larger window \(the model menu\) or a shorter message, or start a new session\.$",
        turn.error,
    ), turn.error
    assert small.requests == [], "nothing was sent"
    assert Turn.objects.get(pk=turn.pk).words == words, "the message stays stored"


def test_a_refusal_by_the_server_is_a_clear_turn_error(user: Any, workspace: Workspace) -> None:
    with ScriptedServer(n_ctx=1000, server_api=False) as quiet:
        session = _session(user, workspace, quiet, configured=100_000)
        turn = run(_loop(session).send("hello")).turn
    assert turn.status == TurnStatus.FAILED
    assert "refused the request: it is " in turn.error
    assert turn.error.endswith(
        "tokens; the model's context window is 1,000. Compact now, start a new session, or use a model with a "
        "larger window."
    )
    assert ModelEndpoint.objects.get(pk=session.endpoint_id).window == 1000, "the window the refusal names is kept"


def test_a_server_restarted_with_a_larger_window_is_asked_again_before_a_request_is_refused(
    user: Any, workspace: Workspace, small: ScriptedServer
) -> None:
    session = _session(user, workspace, small, configured=N_CTX)
    endpoint_window_record(endpoint=session.endpoint, url=small.base_url, tokens=2000, how="llama.cpp /props n_ctx")
    small.push(Step(text="read it"))
    turn = run(_loop(session).send("read this: " + FILLER * 1000)).turn  # over 2,000 tokens, well within 8,000
    assert turn.status == TurnStatus.DONE, turn.error
    endpoint = ModelEndpoint.objects.get(pk=session.endpoint_id)
    assert (endpoint.window, endpoint.server_window_how) == (N_CTX, "llama.cpp /props n_ctx")


def test_a_server_out_of_reach_has_its_window_asked_again_before_the_next_use(user: Any, workspace: Workspace) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    endpoint = ModelEndpoint.objects.create(name="gone", base_url=f"http://127.0.0.1:{port}/v1", model="scripted")
    endpoint_window_record(endpoint=endpoint, url=endpoint.base_url, tokens=4096, how="llama.cpp /props n_ctx")
    session = session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tool_list(allow_commands=False)
    )
    turn = run(_loop(session).send("hello")).turn
    assert turn.status == TurnStatus.FAILED and "Cannot reach" in turn.error, turn.error
    assert ModelEndpoint.objects.get(pk=endpoint.pk).server_window_read_at is None


def test_compact_now_that_cannot_fit_is_refused_before_it_is_sent_and_says_what_helps(
    user: Any, workspace: Workspace, small: ScriptedServer
) -> None:
    """On a model too small for the conversation, Retry advised Compact now, and Compact now failed with the same
    advice (its request is the whole conversation and the task). It is refused before it is sent, and says what
    helps instead."""
    session = _session(user, workspace, small, configured=N_CTX)
    small.push(Step(text="noted"))
    assert run(_loop(session).send("keep these: " + FILLER * 2550)).turn.status == TurnStatus.DONE
    endpoint_window_record(endpoint=session.endpoint, url=session.endpoint.base_url, tokens=3000, how="restarted")
    ModelEndpoint.objects.filter(pk=session.endpoint_id).update(context_window=3000)
    sent = len(small.requests)
    with pytest.raises(RequestTooLarge) as refused:
        run(_loop(session).compact())
    assert "compacting cannot make it fit" in str(refused.value) and "Compact now" not in str(refused.value)
    assert len(small.requests) == sent, "nothing was sent"
