"""A short session through the reply loop against a real llama.cpp server on a generated model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.tools import tool_list
from sessions_app import prompts
from sessions_app.models import BreakCause, ModelEndpoint, ModelRequest, RequestKind, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.llama import LlamaServer
from tests.agent.loop_helpers import run

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]


def test_a_session_against_llama_cpp_records_cached_tokens(
    llama_32k: LlamaServer, user: Any, workspace: Workspace, workspace_dir: Path
) -> None:
    llama = llama_32k
    (workspace_dir / "AGENTS.md").write_text("Answer briefly.\n")
    endpoint = ModelEndpoint.objects.create(name="llama", base_url=llama.base_url, model="tiny", context_window=32768)
    session = session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="tiny", tools=tool_list(allow_commands=False)
    )
    loop = ReplyLoop(session, client_timeouts=Timeouts(connect=5, first_token=60, between_chunks=30))
    for words in ("Hello there, what is in this workspace?", "And what should we do next?", "Thanks."):
        turn = run(loop.send(words)).turn
        assert turn.status == TurnStatus.DONE, turn.error
    requests = list(ModelRequest.objects.filter(session=session).order_by("id"))
    assert len(requests) >= 3
    assert requests[0].break_cause == BreakCause.FIRST
    assert all(r.break_cause != BreakCause.UNEXPECTED for r in requests)
    later = requests[1:]
    assert all(r.prompt_tokens and r.cached_tokens is not None for r in later)
    assert all((r.cached_tokens or 0) > 0 for r in later)
    assert all(r.timings and "cache_n" in r.timings for r in requests)
    assert requests[-1].cached_tokens and requests[-1].prompt_tokens
    assert requests[-1].cached_tokens / requests[-1].prompt_tokens > 0.8


def test_a_title_costs_the_cache_nothing_on_llama_cpp(
    llama_32k: LlamaServer, user: Any, workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """The title's request reads only the reply's end and its own question (the model's vocabulary is bytes: a
    token a byte), and the next turn finds the whole conversation cached, the reply included."""
    endpoint = ModelEndpoint.objects.create(
        name="llama", base_url=llama_32k.base_url, model="tiny", context_window=32768
    )
    session = session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="tiny", tools=tool_list(allow_commands=False)
    )
    timeouts = Timeouts(connect=5, first_token=60, between_chunks=30)
    for words in ("Hello there, what is in this workspace?", "And what should we do next?"):
        turn = run(ReplyLoop(session, client_timeouts=timeouts, titles=True).send(words)).turn
        assert turn.status == TurnStatus.DONE, turn.error
    requests = list(ModelRequest.objects.filter(session=session).order_by("id"))
    kinds = [r.kind for r in requests]
    assert kinds.count(RequestKind.TITLE) == 1, kinds
    at = kinds.index(RequestKind.TITLE)
    replied, title, after = requests[at - 1], requests[at], requests[at + 1]
    assert title.status == "done" and after.kind == RequestKind.REPLY
    assert all(r.break_cause != BreakCause.UNEXPECTED for r in requests)
    processed = (title.prompt_tokens or 0) - (title.cached_tokens or 0)
    with capsys.disabled():
        print(
            f"\ntitle request: {title.prompt_tokens} prompt tokens, {title.cached_tokens} cached, {processed} "
            f"processed (the task is {len(prompts.title_task().encode())} bytes); next request: "
            f"{after.prompt_tokens} prompt, {after.cached_tokens} cached"
        )
    assert (title.cached_tokens or 0) >= (replied.prompt_tokens or 0), "nothing of the conversation read again"
    reply_bytes = len(turn_text(replied).encode())
    assert processed <= len(prompts.title_task().encode()) + reply_bytes + 64  # and the template's few tokens
    assert (after.cached_tokens or 0) >= (title.cached_tokens or 0), "the next turn finds the conversation cached"


def turn_text(request: ModelRequest) -> str:
    assert request.turn is not None
    return request.turn.reply_text
