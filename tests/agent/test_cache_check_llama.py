"""Every cache miss explained, on a real llama.cpp server: none in a normal session, *server* when another
session takes the one slot, *template* on the message a template renders without its earlier reasoning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.tools import tool_list
from sessions_app.models import BreakCause, CacheMiss, ChatSession, ModelEndpoint, ModelRequest, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.chat_templates import TEMPLATE_SHAPES
from testing.llama import LlamaServer
from testing.tiny_gguf import ModelShape, write_model
from tests.agent.loop_helpers import run

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]

CONTEXT = 32768
TIMEOUTS = Timeouts(connect=5, first_token=60, between_chunks=30)
SCRIPT = (
    "<think>\nI will read it.\n</think>\n\n"
    '<tool_call>\n{"name": "read", "arguments": {"path": "notes.md"}}\n</tool_call>'
)


@pytest.fixture
def noise_llama(llama_32k: LlamaServer) -> LlamaServer:
    """The shared server of the noise model (``tests/agent/conftest.py``): one slot, no host-memory cache."""
    return llama_32k


@pytest.fixture(scope="module")
def reasoning_llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = write_model(
        tmp_path_factory.mktemp("model") / "latest-reasoning.gguf",
        ModelShape(ctx=CONTEXT),
        chat_template=TEMPLATE_SHAPES["latest_reasoning"],
        script=SCRIPT,
    )
    with LlamaServer(model, ctx_size=CONTEXT, n_predict=8, alias="tiny") as server:
        yield server


def start(user: Any, workspace: Workspace, server: LlamaServer, name: str) -> ChatSession:
    endpoint, _ = ModelEndpoint.objects.get_or_create(
        name=name, defaults={"base_url": server.base_url, "model": "tiny", "context_window": CONTEXT}
    )
    return session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="tiny", tools=tool_list(allow_commands=False)
    )


def requests_of(session: ChatSession) -> list[ModelRequest]:
    return list(ModelRequest.objects.filter(session=session).order_by("id"))


def test_a_normal_session_shows_no_miss(
    noise_llama: LlamaServer, user: Any, workspace: Workspace, workspace_dir: Path
) -> None:
    session = start(user, workspace, noise_llama, "noise")
    loop = ReplyLoop(session, client_timeouts=TIMEOUTS)
    for words in ("Hello there, what is in this workspace?", "And what should we do next?", "Thanks."):
        assert run(loop.send(words)).turn.status == TurnStatus.DONE
    first, *later = requests_of(session)
    assert first.break_cause == BreakCause.FIRST and first.expected_cached_tokens is None
    assert later
    for request in later:
        assert request.expected_cached_tokens and request.expected_cached_tokens > 0
        assert request.cached_tokens is not None and request.cached_tokens + 1 >= request.expected_cached_tokens
        assert request.cache_miss == "" and request.cache_miss_tokens is None


def test_a_slot_taken_by_another_session_is_a_server_miss(
    noise_llama: LlamaServer, user: Any, workspace: Workspace, workspace_dir: Path
) -> None:
    first = start(user, workspace, noise_llama, "noise")
    second = start(user, workspace, noise_llama, "noise")
    first_loop = ReplyLoop(first, client_timeouts=TIMEOUTS)
    second_loop = ReplyLoop(second, client_timeouts=TIMEOUTS)
    assert run(first_loop.send("Ada asks: what is in this workspace?")).turn.status == TurnStatus.DONE
    assert run(second_loop.send("Bob asks something else entirely.")).turn.status == TurnStatus.DONE
    assert run(first_loop.send("Ada again: and next?")).turn.status == TurnStatus.DONE
    evicted = requests_of(first)[-1]
    assert evicted.break_cause in ("", BreakCause.NEW_TURN)
    assert evicted.expected_cached_tokens is not None and evicted.cached_tokens is not None
    assert evicted.cached_tokens < evicted.expected_cached_tokens
    assert evicted.cache_miss == CacheMiss.SERVER
    assert evicted.cache_miss_tokens == evicted.expected_cached_tokens - evicted.cached_tokens
    assert evicted.cache_miss_message is None


def test_a_template_dropping_earlier_reasoning_is_a_template_miss_on_that_message(
    reasoning_llama: LlamaServer, user: Any, workspace: Workspace, workspace_dir: Path
) -> None:
    (workspace_dir / "notes.md").write_text("hello\n")
    session = start(user, workspace, reasoning_llama, "reasoning")
    loop = ReplyLoop(session, client_timeouts=TIMEOUTS, max_steps=3)
    run(loop.send("Read notes.md, please."))
    first, second, third = requests_of(session)
    assert first.break_cause == BreakCause.FIRST
    assert second.break_cause == "" and second.cache_miss == ""
    assert third.break_cause == "", "the bytes continue the request before: no harness break"
    assert third.cache_miss == CacheMiss.TEMPLATE
    assert third.cache_miss_message == 2, "the first step's assistant message, after the system prompt and the user"
    assert "I will read it." in third.cache_miss_before
    assert "I will read it." not in third.cache_miss_after
    assert third.cache_miss_tokens and third.expected_cached_tokens
    assert third.cache_miss_tokens > 0
