"""The cache check never holds the session: a loop hands its checks to a worker's queue or, with none, runs them once
the reply has ended and the session is let go; every check is stored by the time the action ends, and a check that
fails fails nothing."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from chat import wire
from chat.agent import cache_check
from chat.agent.cache_check import CheckSpec
from chat.agent.events import CacheChecked, ReplyEvent, RequestFinished, RequestStarted, TurnEnded
from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.tools import tool_list
from chat.web import tabs
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, TurnStatus, Workspace
from sessions_app.services.locks import reply_running
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)


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


def test_the_checks_run_once_the_session_is_let_go_and_the_requests_never_wait_for_them(
    user: Any, workspace: Workspace, notes: Path
) -> None:
    """Without a worker to hand them to, the action runs its checks itself once the reply has ended and the
    session's lock is let go: a new message may come meanwhile."""
    with ScriptedServer(n_ctx=50_000, server_api_delay=0.3) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        running_at_check: list[bool] = []

        def seen(event: ReplyEvent) -> None:
            if isinstance(event, CacheChecked):
                running_at_check.append(reply_running(session))

        events = run(ReplyLoop(session, client_timeouts=FAST).send("read the notes twice"), each=seen).events
    first, second, third = ModelRequest.objects.filter(session=session).order_by("id")
    assert first.expected_cached_tokens is None, "the first request has nothing to be compared with"
    for request in (second, third):
        assert request.expected_cached_tokens is not None and request.expected_cached_tokens > 0
        assert request.cache_miss == ""
    ended = next(index for index, event in enumerate(events) if isinstance(event, TurnEnded))
    assert _where(events, CacheChecked, second) > ended and _where(events, CacheChecked, third) > ended
    assert running_at_check == [False, False], "the session is free while its checks run"
    assert not any(isinstance(event, CacheChecked) and event.request.pk == first.pk for event in events)


def test_a_loop_with_a_place_for_its_checks_hands_them_on_and_runs_none(
    user: Any, workspace: Workspace, notes: Path
) -> None:
    handed: list[CheckSpec] = []

    async def later(specs: list[CheckSpec]) -> None:
        handed.extend(specs)
        batches.append(len(specs))

    batches: list[int] = []

    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        ran = run(ReplyLoop(session, client_timeouts=FAST, checks=later).send("read the notes twice"))
    _, second, third = ModelRequest.objects.filter(session=session).order_by("id")
    assert [spec.request_id for spec in handed] == [second.pk, third.pk]
    assert batches == [2], "the action's checks are handed on at once, as one job"
    assert not any(isinstance(event, CacheChecked) for event in ran.events)
    assert [CheckSpec.from_json(json.loads(json.dumps(spec.as_json()))) for spec in handed] == handed


def test_a_check_that_fails_is_logged_and_the_reply_goes_on(
    user: Any, workspace: Workspace, notes: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("the tokenizer fell over")

    monkeypatch.setattr(cache_check, "spec_checked", broken)
    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        with caplog.at_level(logging.ERROR, logger="chat.agent.cache_check"):
            ran = run(ReplyLoop(session, client_timeouts=FAST).send("read the notes twice"))
    assert ran.turn.status == TurnStatus.DONE and ran.turn.reply_text.endswith("Done.")
    assert not any(isinstance(event, CacheChecked) for event in ran.events)
    assert ModelRequest.objects.filter(session=session, expected_cached_tokens__isnull=False).count() == 0
    assert sum("the cache check of request" in record.getMessage() for record in caplog.records) == 2


def test_a_checked_request_redraws_its_bar_with_the_check(user: Any, workspace: Workspace, notes: Path) -> None:
    bars: dict[int, list[str]] = {}

    def shown(event: ReplyEvent) -> None:
        """Each request's bar as a tab is shown it when the event comes."""
        if isinstance(event, RequestFinished | CacheChecked):
            message = wire.checked(wire.event_message(event.request.session_id, event))
            texts = tabs.FROM_STORE[message["event"]](message)
            bars.setdefault(event.request.pk, []).extend(text for text in texts if f'"bar-{event.request.pk}"' in text)

    with ScriptedServer(n_ctx=50_000) as server:
        session = _session(user, workspace, server)
        _three_steps(server)
        run(ReplyLoop(session, client_timeouts=FAST).send("read the notes twice"), each=shown)
    third = ModelRequest.objects.filter(session=session).order_by("id")[2]
    assert len(bars[third.pk]) == 2, "drawn when the request finished, again when its check was stored"
    assert "expected cached" not in bars[third.pk][0] and "expected cached" in bars[third.pk][1]
    assert "cache miss: none" in bars[third.pk][1]


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
