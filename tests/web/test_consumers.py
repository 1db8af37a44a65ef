"""The chat websocket, through the whole ASGI stack (origin check, session auth, routing), against the
scripted model server; the runner's threads do the replies."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from cachet.asgi import application
from chat.testing.scripted_server import ScriptedServer, Step
from chat.web import runner
from sessions_app.models import ChatSession, Turn, TurnStatus

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

LONG = " ".join(f"w{n}" for n in range(150))
STREAM_DELTA = re.compile(r'^<span hx-swap-oob="beforeend:#stream-(\d+)">(.*)</span>$', re.S)


def cookie_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.fixture
def ada_cookie(user: Any) -> str:
    return cookie_for(user)


@pytest.fixture
def bob_cookie(other_user: Any) -> str:
    return cookie_for(other_user)


@pytest_asyncio.fixture(autouse=True)
async def fresh_layer() -> AsyncIterator[None]:
    """An empty channel layer for each test; jobs end while the test's loop still runs to take their events."""
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
    yield
    await settle()


def socket(session_id: int, cookie: str | None, *, origin: str = "http://127.0.0.1:8000") -> WebsocketCommunicator:
    headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/sessions/{session_id}/", headers=headers)


async def connected(session_id: int, cookie: str) -> tuple[WebsocketCommunicator, str]:
    communicator = socket(session_id, cookie)
    ok, _ = await communicator.connect()
    assert ok
    first = await communicator.receive_from(timeout=10)
    assert 'id="transcript" hx-swap-oob="innerHTML"' in first
    return communicator, first


async def until(communicator: WebsocketCommunicator, done: Callable[[str], bool], *, timeout: float = 15) -> list[str]:
    """Messages received until one satisfies ``done`` (included)."""
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            message = await communicator.receive_from(timeout=timeout)
            seen.append(message)
            if done(message):
                return seen


def idle(message: str) -> bool:
    return 'id="controls" data-state="idle"' in message


async def settle() -> None:
    await sync_to_async(runner.wait_idle)(20, cancel=True)


async def test_anonymous_is_refused(live_session: ChatSession) -> None:
    communicator = socket(live_session.pk, None)
    ok, _ = await communicator.connect()
    assert not ok


async def test_another_origin_is_refused(live_session: ChatSession, ada_cookie: str) -> None:
    communicator = socket(live_session.pk, ada_cookie, origin="http://evil.example")
    ok, _ = await communicator.connect()
    assert not ok


async def test_another_user_is_closed_with_4404(live_session: ChatSession, bob_cookie: str) -> None:
    communicator = socket(live_session.pk, bob_cookie)
    ok, _ = await communicator.connect()
    assert ok
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}
    missing = socket(999_999, bob_cookie)
    ok, _ = await missing.connect()
    assert ok and (await missing.receive_output(timeout=5))["code"] == 4404


async def test_a_reply_streams_token_by_token_and_ends_stored(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})], chunk_size=2),
        Step(text="It has **30** lines.", reasoning="Count them.", chunk_size=2),
    )
    communicator, _ = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "How long?", "HEADERS": {"HX-Request": "true"}})
    messages = await until(communicator, idle)
    deltas = [m for m in messages if STREAM_DELTA.match(m)]
    assert "".join(STREAM_DELTA.match(m).group(2) for m in deltas) == "Reading.It has **30** lines."  # type: ignore[union-attr]
    assert len(deltas) > 5
    joined = "".join(messages)
    assert "beforeend:#transcript:not(:has(#turn-1))" in joined
    assert '<li class="tool kind-read" id="call-' in joined and "#0001" in joined
    assert 'id="chart" hx-swap-oob="innerHTML"' in joined
    assert '<article class="turn" id="turn-1" data-turn="1" data-status="done" hx-swap-oob="true">' in joined
    assert "<strong>30</strong>" in joined
    assert '<span hx-swap-oob="beforeend:#reasoning-1">Co</span>' in joined
    assert '<ul hx-swap-oob="beforeend:#calling-1"><li>calling read…</li></ul>' in joined
    final = next(m for m in messages if 'data-status="done" hx-swap-oob="true"' in m)
    assert '<details class="reasoning"><summary>Reasoning</summary>' in final and "Count them." in final
    turn = await database_sync_to_async(Turn.objects.get)(session=live_session)
    assert turn.status == TurnStatus.DONE and turn.reply_text == "Reading.\n\nIt has **30** lines."
    await communicator.disconnect()


async def test_a_second_send_while_a_reply_runs_is_refused(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text=LONG, chunk_size=3, delay=0.02))
    communicator, _ = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Long one"})
    await until(communicator, lambda m: STREAM_DELTA.match(m) is not None)
    await communicator.send_json_to({"type": "send", "text": "Impatient"})
    messages = await until(communicator, lambda m: "notice" in m and "already running" in m)
    assert "A reply is already running in this session; wait for it or stop it first." in messages[-1]
    back = await until(communicator, lambda m: 'id="composer-text"' in m)
    assert ">Impatient</textarea>" in back[-1]
    for kind in ("undo", "regenerate", "compact"):
        await communicator.send_json_to({"type": kind})
        await until(communicator, lambda m: "already running" in m)
    await communicator.send_json_to({"type": "stop"})
    await until(communicator, idle)
    turns = await database_sync_to_async(lambda: list(Turn.objects.values_list("words", "status")))()
    assert turns == [("Long one", TurnStatus.INTERRUPTED)]
    await communicator.disconnect()


async def test_stop_cancels_the_reply_and_keeps_what_came(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text=LONG, chunk_size=3, delay=0.02))
    communicator, _ = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Long one"})
    await until(communicator, lambda m: STREAM_DELTA.match(m) is not None)
    await communicator.send_json_to({"type": "stop"})
    messages = await until(communicator, idle)
    assert any('data-status="interrupted"' in m and "Stopped." in m for m in messages)
    turn = await database_sync_to_async(Turn.objects.get)(session=live_session)
    assert turn.status == TurnStatus.INTERRUPTED and turn.reply_text.startswith("w0 w1")
    assert not turn.reply_text.endswith("w149")
    await communicator.disconnect()


async def test_the_reply_goes_on_without_the_tab_and_a_new_tab_catches_up_without_duplicates(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text=LONG, chunk_size=2, delay=0.01))
    first, _ = await connected(live_session.pk, ada_cookie)
    await first.send_json_to({"type": "send", "text": "Long one"})
    await until(first, lambda m: STREAM_DELTA.match(m) is not None)
    await first.disconnect()  # the tab closes; the reply goes on
    await asyncio.sleep(0.2)
    second, sync = await connected(live_session.pk, ada_cookie)
    shown = re.search(r'<div class="stream" id="stream-1" hx-disable>(.*?)</div>', sync, re.S)
    assert shown is not None and shown.group(1)
    text = shown.group(1)
    messages = await until(second, lambda m: 'data-status="done" hx-swap-oob="true"' in m)
    for message in messages:
        match = STREAM_DELTA.match(message)
        if match:
            text += match.group(2)
    assert text == LONG
    await until(second, idle)
    await second.disconnect()


async def test_undo_gives_the_words_back_and_rewind_checks_its_turn(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text="Two."))
    communicator, _ = await connected(live_session.pk, ada_cookie)
    for words in ("First", "Second"):
        await communicator.send_json_to({"type": "send", "text": words})
        await until(communicator, idle)
    await communicator.send_json_to({"type": "undo", "restore": "1"})
    messages = await until(communicator, lambda m: "Took back turn 2." in m)
    joined = "".join(messages)
    assert ">Second</textarea>" in joined
    transcript = next(m for m in messages if m.startswith('<div id="transcript"'))
    assert 'id="turn-1"' in transcript and 'id="turn-2"' not in transcript
    await until(communicator, idle)
    await communicator.send_json_to({"type": "rewind", "turn": 7})
    messages = await until(communicator, lambda m: "has no live turn 7" in m)
    await until(communicator, idle)
    await communicator.send_json_to({"type": "rewind", "turn": "x"})
    await until(communicator, lambda m: "Rewind needs the number of a turn." in m)
    await communicator.send_json_to({"type": "rewind", "turn": 1})
    messages = await until(communicator, lambda m: "Took back turn 1." in m)
    assert ">First</textarea>" in "".join(messages)
    await until(communicator, idle)
    await communicator.disconnect()


async def test_mode_size_and_malformed_messages(
    live_session: ChatSession, ada_cookie: str, settings: Any, model: ScriptedServer
) -> None:
    settings.CACHET_MAX_MESSAGE_BYTES = 1000
    communicator, _ = await connected(live_session.pk, ada_cookie)
    watcher, _ = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "mode", "mode": "plan"})
    await until(communicator, lambda m: "takes effect as a note" in m)
    mine = await until(communicator, lambda m: 'id="mode-control"' in m)
    assert '<option value="plan" selected>' in mine[-1]
    theirs = await until(watcher, lambda m: 'id="mode-control"' in m)
    assert '<option value="plan" selected>' in theirs[-1]
    assert (await database_sync_to_async(ChatSession.objects.get)(pk=live_session.pk)).mode == "plan"
    await communicator.send_json_to({"type": "mode", "mode": "root"})
    await until(communicator, lambda m: "Unknown mode" in m)
    await communicator.send_json_to({"type": "send", "text": "x" * 2000})
    await until(communicator, lambda m: "the most Cachet takes is 1000 bytes" in m)
    await communicator.send_to(text_data="not json")
    await until(communicator, lambda m: "not JSON" in m)
    await communicator.send_to(text_data="[1, 2]")
    await until(communicator, lambda m: "not an object" in m)
    await communicator.send_json_to({"type": "launch"})
    await until(communicator, lambda m: "does not know the request" in m)
    await communicator.send_json_to({"type": "send", "text": "   "})
    await until(communicator, lambda m: "Write a message first." in m)
    assert model.requests == []
    assert await database_sync_to_async(Turn.objects.count)() == 0
    await communicator.disconnect()
    await watcher.disconnect()


async def test_a_logged_out_tab_is_closed_on_its_next_message(live_session: ChatSession, ada_cookie: str) -> None:
    communicator, _ = await connected(live_session.pk, ada_cookie)
    from django.contrib.sessions.models import Session

    await database_sync_to_async(Session.objects.filter(session_key=ada_cookie).delete)()
    await communicator.send_json_to({"type": "send", "text": "still there?"})
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    assert await database_sync_to_async(Turn.objects.count)() == 0


async def test_a_deleted_session_closes_its_socket(live_session: ChatSession, ada_cookie: str) -> None:
    communicator, _ = await connected(live_session.pk, ada_cookie)
    await database_sync_to_async(ChatSession.objects.filter(pk=live_session.pk).delete)()
    await communicator.send_json_to({"type": "stop"})
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}


async def test_a_failed_reply_and_compaction(live_session: ChatSession, ada_cookie: str, model: ScriptedServer) -> None:
    model.push(Step(fault="http500", text="exploded"))
    communicator, _ = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Hi"})
    messages = await until(communicator, idle)
    final = next(m for m in messages if 'data-status="failed"' in m)
    assert "exploded" in final and 'class="retry"' in final
    model.push(Step(text="Summary of it."))
    await communicator.send_json_to({"type": "compact"})
    messages = await until(communicator, idle)
    joined = "".join(messages)
    assert "Compacted" in joined and 'class="compaction"' in joined
    await communicator.send_json_to({"type": "compact"})
    await until(communicator, lambda m: "nothing to compact" in m.lower() or "no summary" in m.lower())
    await until(communicator, idle)
    await communicator.disconnect()
    await settle()
    assert json.loads(model.requests[-1])["messages"][-1]["role"] == "user"
