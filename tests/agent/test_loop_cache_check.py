"""The cache check runs beside the reply: the next request does not wait for the server to render and tokenize
the last one, every check is stored by the time the action ends, and a check that fails fails nothing."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import chat.agent.loop as loop_module
from chat.agent.events import CacheChecked, ReplyEvent, RequestFinished, RequestStarted
from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.agent.model.stream import IDLE_SECONDS
from chat.tools import tool_list
from chat.web.publisher import Publisher, _Send
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)
HELD_AT_MOST = 20.0  # then the checks answer, and the test fails if the third request had waited for them


def _session(user: Any, workspace: Workspace, server: ScriptedServer) -> ChatSession:
    endpoint = ModelEndpoint.objects.create(name="slow", base_url=server.base_url, model="scripted")
    return session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tool_list(allow_commands=False)
    )


def _three_steps(server: ScriptedServer) -> None:
    server.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(text="Once more.", tool_calls=[("read", {"path": "notes.md", "offset": 2})]),
        Step(text="Done."),
    )


def _where(
    events: list[ReplyEvent], kind: type[RequestStarted | RequestFinished | CacheChecked], request: ModelRequest
) -> int:
    return next(
        index for index, event in enumerate(events) if isinstance(event, kind) and event.request.pk == request.pk
    )


def test_the_next_request_goes_out_while_the_last_ones_check_still_runs(
    user: Any, workspace: Workspace, notes: Path
) -> None:
    # From the first request on (before it, the loop counts it with the server's tokenizer), the server renders
    # and tokenizes nothing until the third request has come.
    held = threading.Event()
    held.set()

    def until_the_third_request() -> None:
        server.wait_requests(1, timeout=HELD_AT_MOST)
        held.clear()
        server.wait_requests(3, timeout=HELD_AT_MOST)
        held.set()

    with ScriptedServer(n_ctx=50_000, server_api_held=held) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        opener = threading.Thread(target=until_the_third_request)
        opener.start()
        try:
            events = run(ReplyLoop(session, client_timeouts=FAST).send("read the notes twice")).events
        finally:
            held.set()
            opener.join()
    first, second, third = ModelRequest.objects.filter(session=session).order_by("id")
    assert first.expected_cached_tokens is None, "the first request has nothing to be compared with"
    for request in (second, third):
        assert request.expected_cached_tokens is not None and request.expected_cached_tokens > 0
        assert request.cache_miss == ""
    assert _where(events, RequestStarted, third) < _where(events, CacheChecked, second), (
        "the third request did not wait for the second one's check"
    )
    assert _where(events, CacheChecked, third) > _where(events, RequestFinished, third)
    assert not any(isinstance(event, CacheChecked) and event.request.pk == first.pk for event in events)


def test_a_finished_check_is_stored_while_the_model_is_quiet_never_between_an_answer_and_the_next_request(
    user: Any, workspace: Workspace, notes: Path
) -> None:
    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        server.push(
            Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
            Step(text="Once more.", tool_calls=[("read", {"path": "notes.md", "offset": 2})]),
            Step(text="Again.", tool_calls=[("read", {"path": "notes.md", "offset": 3})]),
            Step(text="Done.", chunk_size=100, delay=IDLE_SECONDS * 2),  # the model thinks before its first token
        )
        events = run(ReplyLoop(session, client_timeouts=FAST).send("read the notes")).events
    _, second, third, fourth = ModelRequest.objects.filter(session=session).order_by("id")
    # The third and fourth requests followed the answers before them at once: the second's check waited.
    assert _where(events, CacheChecked, second) > _where(events, RequestStarted, fourth)
    # The model was quiet before its fourth answer: the checks done by then were stored meanwhile.
    assert _where(events, CacheChecked, second) < _where(events, RequestFinished, fourth)
    assert _where(events, CacheChecked, third) < _where(events, RequestFinished, fourth)
    assert _where(events, CacheChecked, fourth) > _where(events, RequestFinished, fourth)


def test_a_check_that_fails_is_logged_and_the_reply_goes_on(
    user: Any, workspace: Workspace, notes: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("the tokenizer fell over")

    monkeypatch.setattr(loop_module, "check_request", broken)
    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        with caplog.at_level(logging.ERROR, logger="chat.agent.loop"):
            ran = run(ReplyLoop(session, client_timeouts=FAST).send("read the notes twice"))
    assert ran.turn.status == TurnStatus.DONE and ran.turn.reply_text.endswith("Done.")
    assert not any(isinstance(event, CacheChecked) for event in ran.events)
    assert ModelRequest.objects.filter(session=session, expected_cached_tokens__isnull=False).count() == 0
    assert sum("the cache check of request" in record.getMessage() for record in caplog.records) == 2


def test_a_checked_request_redraws_its_bar_with_the_check(user: Any, workspace: Workspace, notes: Path) -> None:
    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        sent: list[str] = []

        def put(item: object) -> None:
            if isinstance(item, _Send):
                sent.append(item.text)

        publisher = Publisher(session, put=put, reply_to=None, label="")
        for event in ReplyLoop(session, client_timeouts=FAST).send("read the notes twice"):
            publisher.publish(event)
    third = ModelRequest.objects.filter(session=session).order_by("id")[2]
    bars = [text for text in sent if f'"bar-{third.pk}"' in text]
    assert len(bars) == 2, "drawn when the request finished, again when its check was stored"
    assert "expected cached" not in bars[0] and "expected cached" in bars[1]
    assert "cache miss: none" in bars[1]


def test_each_request_is_rendered_by_the_server_once_and_kept_by_its_bytes(
    user: Any, workspace: Workspace, notes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chat.agent import server_api

    rendered: list[int] = []
    real = server_api.apply_template

    def counted(base_url: str, messages: Any, **options: Any) -> str | None:
        rendered.append(len(messages))
        return real(base_url, messages, **options)

    monkeypatch.setattr(server_api, "apply_template", counted)
    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        run(ReplyLoop(session, client_timeouts=FAST).send("read the notes twice"))
        server_api.forget(server.base_url)
    second, third = ModelRequest.objects.filter(session=session).order_by("id")[1:]
    assert second.expected_cached_tokens and third.expected_cached_tokens
    # the short question, then the three requests once each: the third's check found the second's kept
    assert rendered[0] == 1
    assert sorted(rendered[1:]) == sorted(set(rendered[1:])) and len(rendered[1:]) == 3
