"""The chat websocket, through the whole ASGI stack (origin check, session auth, routing), against the
scripted model server; a worker of the task queue on the test's event loop does the replies."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from html import unescape
from typing import Any

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from cachet.asgi import application
from cachet.pg_layer import LAYER_BACK
from chat import wire
from chat.actions import Send
from chat.web import queueing
from chat.web.messages import MESSAGE_LIMIT
from chat.worker import jobs
from chat.worker import publish as worker_publish
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, Turn, TurnStatus, Workspace
from testing.scripted_server import ScriptedServer, Step
from tests.worker_kit import running_worker

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

LONG = " ".join(f"w{n}" for n in range(150))


def cookie_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


@pytest.fixture
def ada_cookie(user: Any) -> str:
    return cookie_for(user)


@pytest.fixture
def bob_cookie(other_user: Any) -> str:
    return cookie_for(other_user)


@pytest_asyncio.fixture(autouse=True)
async def fresh_layer() -> AsyncIterator[None]:
    """An empty channel layer and a worker for each test; jobs end while the test's loop still runs to take their
    events."""
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
    async with running_worker():
        yield


@dataclass
class Got:
    """The messages a tab received, decoded, and the page they build: element ids put and removed, live text."""

    raw: list[str] = field(default_factory=list)
    puts: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    text: dict[tuple[int, int], str] = field(default_factory=dict)
    live_messages: int = 0
    gaps: int = 0
    rev: int = 0

    def take(self, raw: str) -> dict[str, Any]:
        self.raw.append(raw)
        message: dict[str, Any] = json.loads(raw)
        for op in message.get("ops", []):
            if op["op"] == "put":
                self.puts[op["id"]] = op["html"]
                self.values[op["id"]] = ""
            elif op["op"] == "append":
                self.values[op["id"]] += op["text"]
            else:
                self.removed.append(op["id"])
        live = message.get("live")
        if live is not None:
            self.live_messages += 1
            key = (live["turn"], live["step"])
            if live.get("reset"):
                self.text[key] = ""
            have = self.text.get(key, "")
            if "text" in live:
                at = live["text_at"]
                if at > len(have):
                    self.gaps += 1  # as the page does: it drops the piece and asks for the live text
                elif at + len(live["text"]) > len(have):
                    self.text[key] = have[:at] + live["text"]
        self.rev = max(self.rev, message.get("rev", 0))
        return message

    def html(self) -> str:
        return "".join(self.raw)


def socket(session_id: int, cookie: str | None, *, origin: str = "http://127.0.0.1:8000") -> WebsocketCommunicator:
    headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/sessions/{session_id}/", headers=headers)


def controls(message: dict[str, Any]) -> bool:
    return any(op.get("id") == "controls" for op in message.get("ops", []))


def idle(message: dict[str, Any]) -> bool:
    return any(op.get("id") == "controls" and 'data-state="idle"' in op["html"] for op in message.get("ops", []))


async def until(
    communicator: WebsocketCommunicator, got: Got, done: Callable[[dict[str, Any]], bool], *, timeout: float = 15
) -> Got:
    """Take messages until one satisfies ``done`` (included); on a timeout, say what came last."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                raw = await communicator.receive_from(timeout=timeout)
                assert len(raw.encode()) <= MESSAGE_LIMIT
                if done(got.take(raw)):
                    return got
    except TimeoutError:
        turns = await database_sync_to_async(lambda: list(Turn.objects.values_list("number", "status", "error")))()
        last = [raw[:300] for raw in got.raw[-3:]]
        raise AssertionError(f"nothing awaited came within {timeout} s; turns {turns}; last messages {last}") from None


async def connected(
    session_id: int, cookie: str, *, rev: int = 0, first: int = 0, bar: int = 0
) -> tuple[WebsocketCommunicator, Got]:
    """A tab that says hello as the page does, with what it has received in answer."""
    communicator = socket(session_id, cookie)
    ok, _ = await communicator.connect()
    assert ok
    await communicator.send_json_to({"type": "hello", "rev": rev, "first": first, "bar": bar})
    got = await until(communicator, Got(rev=rev), controls)
    return communicator, got


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


async def test_a_reply_streams_piece_by_piece_with_offsets_and_ends_stored(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})], chunk_size=2),
        Step(text="It has **30** lines. " + LONG, reasoning="Count them.", chunk_size=2, delay=0.005),
    )
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "How long?", "HEADERS": {"HX-Request": "true"}})
    await until(communicator, got, idle)
    assert got.text[(1, 1)] == "Reading."
    assert got.text[(1, 2)] == "It has **30** lines. " + LONG
    pieces = len("Reading.") // 2 + len("It has **30** lines. " + LONG) // 2 + len("Count them.") // 2
    assert got.live_messages <= pieces + 8, "a message per piece at most (pieces read together go as one)"
    assert got.gaps == 0
    assert 'id="turn-1"' in got.puts["turn-1"] and 'data-status="done"' in got.puts["turn-1"]
    assert "<strong>30</strong>" in got.puts["turn-1"] and "Count them." in got.puts["turn-1"]
    assert any(key.startswith("call-") and "#0001" in html for key, html in got.puts.items())
    assert any(key.startswith("bar-") for key in got.puts), "each request appends a bar"
    assert "chart" not in got.puts, "the chart is never sent again whole"
    turn = await database_sync_to_async(Turn.objects.get)(session=live_session)
    assert turn.status == TurnStatus.DONE and turn.reply_text == "Reading.\n\nIt has **30** lines. " + LONG
    assert got.rev == turn.revision
    await communicator.disconnect()


async def test_the_server_renders_no_markdown_while_a_step_streams_and_the_stored_step_once(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    text = "It has **30** lines:\n\n- one\n- two\n\n" + LONG
    model.push(Step(text=text, chunk_size=4, delay=0.005))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "How long?"})
    await until(communicator, got, idle)
    assert got.text[(1, 1)] == text, "the page renders the raw text it is sent"
    assert not any(key.startswith("render-") for key in got.puts)
    rendered = [raw for raw in got.raw if "<strong>30</strong>" in raw]
    assert len(rendered) == 2, "the step as it is stored, and its turn once the reply ends (from the rendered cache)"
    assert "<ul>\n<li>one</li>" in got.puts["turn-1"] and LONG[-20:] in got.puts["turn-1"]
    await communicator.disconnect()


async def test_a_tab_that_reconnects_gets_only_what_it_lacks(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text="Two."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "First"})
    await until(communicator, got, idle)
    first_bar = max(int(key.removeprefix("bar-")) for key in got.puts if key.startswith("bar-"))
    seen = got.rev
    await communicator.disconnect()
    up_to_date, again = await connected(live_session.pk, ada_cookie, rev=seen, first=1, bar=first_bar)
    side = f"side-title-{live_session.pk}"
    assert set(again.puts) == {"controls", "mode-control", "session-title", side, "attachments"}, (
        "nothing of the transcript again"
    )
    assert sum(len(raw) for raw in again.raw) < 4000
    await up_to_date.send_json_to({"type": "send", "text": "Second"})
    await until(up_to_date, again, idle)
    await up_to_date.disconnect()
    late, caught = await connected(live_session.pk, ada_cookie, rev=seen, first=1, bar=first_bar)
    assert "turn-2" in caught.puts and "turn-1" not in caught.puts
    assert [key for key in caught.puts if key.startswith("bar-")] == [f"bar-{first_bar + 1}"]
    await late.disconnect()


async def test_a_second_send_while_a_reply_runs_is_refused(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text=LONG, chunk_size=3, delay=0.02))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Long one"})
    await until(communicator, got, lambda m: "live" in m)
    await communicator.send_json_to({"type": "send", "text": "Impatient"})
    await until(communicator, got, lambda m: "already running" in json.dumps(m))
    await until(communicator, got, lambda m: any(op.get("id") == "composer-text" for op in m.get("ops", [])))
    assert ">Impatient</textarea>" in got.puts["composer-text"]
    for kind in ("undo", "regenerate", "compact"):
        await communicator.send_json_to({"type": kind})
        await until(communicator, got, lambda m: "already running" in json.dumps(m))
    await communicator.send_json_to({"type": "stop"})
    await until(communicator, got, idle)
    turns = await database_sync_to_async(lambda: list(Turn.objects.values_list("words", "status")))()
    assert turns == [("Long one", TurnStatus.INTERRUPTED)]
    await communicator.disconnect()


async def test_a_send_made_as_soon_as_the_page_shows_idle_is_taken(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = worker_publish.publish
    idle_out = asyncio.Event()
    second_answered = asyncio.Event()

    async def held(message: dict[str, Any], *, to: str | None = None) -> None:
        """The first job set aside just after its idle state is out, until the next send is answered."""
        await published(message, to=to)
        if message["event"] == "job" and message["state"] == "idle" and not idle_out.is_set():
            idle_out.set()
            await asyncio.wait_for(second_answered.wait(), 30)

    monkeypatch.setattr(jobs, "publish", held)
    model.push(Step(text="One."), Step(text="Two."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "First"})
    await until(communicator, got, idle)
    await asyncio.wait_for(idle_out.wait(), 30)
    await communicator.send_json_to({"type": "send", "text": "Second"})
    try:
        await until(
            communicator,
            got,
            lambda m: queueing.QUEUED in json.dumps(m, ensure_ascii=False) or "already running" in json.dumps(m),
        )
    finally:
        second_answered.set()
    await until(communicator, got, idle)
    assert "already running" not in got.html()
    turns = await database_sync_to_async(lambda: list(Turn.objects.values_list("words", "status")))()
    assert turns == [("First", TurnStatus.DONE), ("Second", TurnStatus.DONE)]
    await communicator.disconnect()


async def test_a_tab_is_asked_to_say_hello_again_when_its_channel_layer_is_back_and_then_catches_up(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    communicator, got = await connected(live_session.pk, ada_cookie)
    model.push(Step(text="Stored while the tab heard nothing."))
    async with running_worker():
        queued = await queueing.start(live_session.pk, Send(words="Meanwhile"), reply_to=None)
        assert queued is not None
        await until_stored(live_session)
    while not await communicator.receive_nothing(timeout=0.3):  # what the reply published: as if lost
        await communicator.receive_from()
    layer = get_channel_layer()
    await layer.group_send(wire.session_group(live_session.pk), {"type": LAYER_BACK})
    asked = json.loads(await communicator.receive_from(timeout=5))
    assert asked == {"hello": True}
    await communicator.send_json_to({"type": "hello", "rev": got.rev, "first": 0, "bar": 0})
    await until(communicator, got, lambda m: "Stored while the tab heard nothing." in json.dumps(m))
    assert 'data-status="done"' in got.puts["turn-1"]
    await communicator.disconnect()


async def until_stored(session: ChatSession) -> None:
    async with asyncio.timeout(15):
        while not await database_sync_to_async(Turn.objects.filter(session=session, status=TurnStatus.DONE).exists)():
            await asyncio.sleep(0.05)


async def test_stop_cancels_the_reply_and_keeps_what_came(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text=LONG, chunk_size=3, delay=0.02))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Long one"})
    await until(communicator, got, lambda m: "live" in m)
    await communicator.send_json_to({"type": "stop"})
    await until(communicator, got, idle)
    assert 'data-status="interrupted"' in got.puts["turn-1"] and "Stopped." in got.puts["turn-1"]
    turn = await database_sync_to_async(Turn.objects.get)(session=live_session)
    # What came before the stop is kept, however little: the stop can land right after the first piece.
    assert turn.status == TurnStatus.INTERRUPTED and turn.reply_text.startswith("w0")
    assert LONG.startswith(turn.reply_text.rstrip()) and not turn.reply_text.endswith("w149")
    await communicator.disconnect()


async def test_the_reply_goes_on_without_the_tab_and_a_new_tab_catches_up_without_duplicates(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text=LONG, chunk_size=2, delay=0.01))
    first, got = await connected(live_session.pk, ada_cookie)
    await first.send_json_to({"type": "send", "text": "Long one"})
    await until(first, got, lambda m: "live" in m)
    await first.disconnect()  # the tab closes; the reply goes on
    second, caught = await connected(live_session.pk, ada_cookie, rev=got.rev, first=1)
    await until(second, caught, lambda m: bool(m.get("live", {}).get("reset")))
    assert caught.text[(1, 1)], "the running reply sends what the step streamed so far"
    await until(second, caught, idle)
    assert caught.text[(1, 1)] == LONG
    assert 'data-status="done"' in caught.puts["turn-1"]
    await second.disconnect()


async def test_no_message_is_larger_than_the_limit_whatever_the_reply(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    huge = "\n".join(f"line {n} " + "x" * 90 for n in range(12_000))
    model.push(Step(text=huge, chunk_size=20_000))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Say a lot"})
    await until(communicator, got, idle, timeout=60)
    assert all(len(raw.encode()) <= MESSAGE_LIMIT for raw in got.raw)
    assert len(huge) > 1_000_000
    assert got.text[(1, 1)] == huge
    await communicator.disconnect()
    late, caught = await connected(live_session.pk, ada_cookie)
    assert "turn-1" in caught.puts
    assert all(len(raw.encode()) <= MESSAGE_LIMIT for raw in caught.raw)
    await late.disconnect()


async def test_undo_gives_the_words_back_and_rewind_checks_its_turn(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text="Two."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    for words in ("First", "Second"):
        await communicator.send_json_to({"type": "send", "text": words})
        await until(communicator, got, idle)
    await communicator.send_json_to({"type": "undo", "restore": "1"})
    await until(communicator, got, lambda m: "Took back turn 2." in json.dumps(m))
    assert ">Second</textarea>" in got.puts["composer-text"]
    if got.removed != ["turn-2"]:  # the notice comes to this tab alone, the removal to all of them: either first
        await until(communicator, got, lambda m: got.removed == ["turn-2"])
    await until(communicator, got, idle)
    await communicator.send_json_to({"type": "rewind", "turn": 7})
    await until(communicator, got, lambda m: "No live turn is left from turn 7 on" in json.dumps(m))
    await until(communicator, got, idle)
    await communicator.send_json_to({"type": "rewind", "turn": "x"})
    await until(communicator, got, lambda m: "Rewind needs the number of a turn." in json.dumps(m))
    await communicator.send_json_to({"type": "rewind", "turn": 1})
    await until(communicator, got, lambda m: "Took back turn 1." in json.dumps(m))
    assert ">First</textarea>" in got.puts["composer-text"]
    await until(communicator, got, idle)
    await communicator.disconnect()


def _label(html: str) -> str:
    found = re.search(r'<span class="turn-no" title="Stored as turn (\d+)">turn (\d+)</span>', html)
    assert found, html[:300]
    return f"{found.group(2)} (stored {found.group(1)})"


def _says(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda message: text in json.dumps(message)


def _siblings(html: str) -> str:
    found = re.search(r'<span class="sibling-at">([^<]*)</span>', html)
    return found.group(1) if found else ""


async def test_edit_branches_and_flip_shows_the_other_branch(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text="Two."), Step(text="Un."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    for words in ("First", "Second"):
        await communicator.send_json_to({"type": "send", "text": words})
        await until(communicator, got, idle)
    before_edit = got.rev
    await communicator.send_json_to({"type": "edit", "turn": 1, "text": "Premier"})
    await until(communicator, got, idle)
    assert got.removed == ["turn-2", "turn-1"]
    new = got.puts["turn-3"]
    assert ">Premier</" in new and 'data-status="done"' in new and "Un." in new
    assert _label(new) == "1 (stored 3)" and _siblings(new) == "2 / 2"
    assert '"type": "flip", "turn": 1' in new
    assert "Took back" not in got.html(), "an edit says nothing of what it replaced"
    await communicator.send_json_to({"type": "flip", "turn": 1})
    await until(communicator, got, idle)
    transcript = got.puts["transcript"]
    assert 'id="turn-1"' in transcript and 'id="turn-2"' in transcript and 'id="turn-3"' not in transcript
    assert "One." in transcript and "Two." in transcript
    assert '<span class="sibling-at">1 / 2</span>' in transcript and '"type": "flip", "turn": 3' in transcript
    await communicator.disconnect()
    # a tab that last saw the branch before the edit, showing turns from 1 on, is brought to the live branch
    late, caught = await connected(live_session.pk, ada_cookie, rev=before_edit, first=1)
    assert "turn-3" in caught.removed and "turn-1" in caught.puts and "turn-2" in caught.puts
    await late.disconnect()
    # a tab that showed the other branch from turn 3 on gets the live branch's transcript whole
    other, again = await connected(live_session.pk, ada_cookie, rev=before_edit, first=3)
    assert 'id="turn-1"' in again.puts["transcript"] and 'id="turn-3"' not in again.puts["transcript"]
    await other.disconnect()


async def test_labels_are_positions_in_the_live_branch_after_undo_and_regenerate(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text="Two."), Step(text="Three."), Step(text="Two again."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    for words in ("First", "Second", "Third"):
        await communicator.send_json_to({"type": "send", "text": words})
        await until(communicator, got, idle)
    await communicator.send_json_to({"type": "undo"})
    await until(communicator, got, lambda m: "Took back turn 3." in json.dumps(m))
    await until(communicator, got, idle)
    await communicator.send_json_to({"type": "regenerate"})
    await until(communicator, got, idle)
    assert _label(got.puts["turn-4"]) == "2 (stored 4)" and _siblings(got.puts["turn-4"]) == "2 / 2"
    await communicator.disconnect()


async def test_edit_and_flip_refuse_what_they_cannot_do(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "First"})
    await until(communicator, got, idle)
    refusals = [
        ({"type": "edit", "turn": 1, "text": "  "}, "Write a message first."),
        ({"type": "edit", "text": "x"}, "Editing needs the number of a turn."),
        ({"type": "flip", "turn": "x"}, "Switching branches needs the number of a turn."),
    ]
    for message, text in refusals:
        await communicator.send_json_to(message)
        await until(communicator, got, _says(text))
    for message, text in [
        ({"type": "edit", "turn": 9, "text": "x"}, "This session has no live turn 9."),
        ({"type": "flip", "turn": 1}, "That turn is already on the live branch."),
        ({"type": "flip", "turn": 9}, "This session has no turn 9."),
    ]:
        await communicator.send_json_to(message)
        await until(communicator, got, _says(text))
        await until(communicator, got, idle)
    turns = await database_sync_to_async(lambda: list(Turn.objects.values_list("number", "status")))()
    assert turns == [(1, TurnStatus.DONE)], "nothing refused changed the store"
    await communicator.disconnect()


async def test_mode_size_and_malformed_messages(
    live_session: ChatSession, ada_cookie: str, settings: Any, model: ScriptedServer
) -> None:
    settings.CACHET_MAX_MESSAGE_BYTES = 1000
    communicator, got = await connected(live_session.pk, ada_cookie)
    watcher, theirs = await connected(live_session.pk, ada_cookie)
    theirs.puts.clear()
    await communicator.send_json_to({"type": "mode", "mode": "plan"})
    await until(communicator, got, lambda m: "takes effect as a note" in json.dumps(m))
    await until(watcher, theirs, lambda m: any(op.get("id") == "mode-control" for op in m.get("ops", [])))
    assert '<option value="plan" selected>' in theirs.puts["mode-control"]
    assert (await database_sync_to_async(ChatSession.objects.get)(pk=live_session.pk)).mode == "plan"
    await database_sync_to_async(
        lambda: Workspace.objects.filter(pk=live_session.workspace_id).update(allow_commands=False)
    )()
    await communicator.send_json_to({"type": "mode", "mode": "full"})
    await until(communicator, got, lambda m: "Mode full: it takes effect" in json.dumps(m))
    assert "Commands are off in this workspace, so the model reads and edits files but runs nothing" in got.raw[-1]
    await until(watcher, theirs, lambda m: "full (no commands in this workspace)" in json.dumps(m))
    await communicator.send_json_to({"type": "mode", "mode": "root"})
    await until(communicator, got, lambda m: "Unknown mode" in json.dumps(m))
    await communicator.send_json_to({"type": "send", "text": "x" * 2000})
    await until(communicator, got, lambda m: "the most Cachet takes is 1000 bytes" in json.dumps(m))
    await communicator.send_to(text_data="not json")
    await until(communicator, got, lambda m: "not JSON" in json.dumps(m))
    await communicator.send_to(text_data="[1, 2]")
    await until(communicator, got, lambda m: "not an object" in json.dumps(m))
    await communicator.send_json_to({"type": "launch"})
    await until(communicator, got, lambda m: "does not know the request" in json.dumps(m))
    await communicator.send_json_to({"type": "send", "text": "   "})
    await until(communicator, got, lambda m: "Write a message first." in json.dumps(m))
    assert model.requests == []
    assert await database_sync_to_async(Turn.objects.count)() == 0
    await communicator.disconnect()
    await watcher.disconnect()


async def test_malformed_requests_get_a_notice_and_the_socket_stays_open(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    communicator, got = await connected(live_session.pk, ada_cookie)
    unreadable = notice_says("its type is not the name of a request")
    frames: list[tuple[object, Callable[[dict[str, Any]], bool]]] = [
        ({"type": {"a": 1}}, unreadable),
        ({"type": ["send"], "text": "x"}, unreadable),
        ({"type": None}, unreadable),
        ({"text": "no type"}, unreadable),
        ({"type": "x" * 100}, notice_says(f"does not know the request &#x27;{'x' * 40}&#x27;.")),
        ([{"type": "send", "text": "x"}], notice_says("not an object")),
        ("[" * 100_000, notice_says("not JSON")),
        ({"type": "hello", "rev": {"a": 1}, "first": [], "bar": "x"}, idle),
        ({"type": "rewind", "turn": {"a": 1}}, notice_says("Rewind needs the number of a turn.")),
        ({"type": "edit", "turn": 1, "text": ["x"]}, notice_says("Write a message first.")),
        ({"type": "mode", "mode": {"a": 1}}, notice_says("Unknown mode")),
        ({"type": "model", "endpoint": {"a": 1}}, notice_says("Choose a model endpoint.")),
    ]
    for frame, answered in frames:
        got.puts.pop("notice", None)
        await communicator.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))
        await until(communicator, got, answered)
    await communicator.send_json_to({"type": "mode", "mode": "plan"})
    await until(communicator, got, notice_says("takes effect as a note"))
    assert model.requests == []
    await communicator.disconnect()


def composer_words(got: Got) -> str:
    """The words the message box holds, as the page puts them together: its text, then what was appended."""
    html = got.puts["composer-text"]
    return unescape(html[html.index(">") + 1 : html.rindex("</textarea>")]) + got.values["composer-text"]


async def test_a_message_over_the_limit_gets_the_notice_and_its_words_back_in_the_box(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    communicator, got = await connected(live_session.pk, ada_cookie)
    words = '<b>Long & "quoted"</b>\n' * 12_000  # 300 KB of text, more as JSON and far more as HTML
    frame = json.dumps({"type": "send", "text": words})
    assert len(frame.encode()) > 300_000
    await communicator.send_to(text_data=frame)
    await until(communicator, got, lambda m: "the most Cachet takes is 200000 bytes" in json.dumps(m))
    assert f"That message is {len(frame.encode())} bytes" in got.puts["notice"]
    assert composer_words(got) == words, "every character back in the box, in messages no larger than the limit"
    await communicator.send_to(
        text_data=json.dumps({"type": "edit", "turn": 1, "text": "é" * 150_000}, ensure_ascii=False)
    )
    await until(communicator, got, lambda m: "That message is 300" in json.dumps(m))
    assert composer_words(got) == "é" * 150_000
    for frame in ("x" * 300_000, "[" * 300_000, json.dumps({"type": "undo", "pad": "x" * 300_000})):
        got.puts.pop("composer-text", None)
        await communicator.send_to(text_data=frame)
        await until(communicator, got, lambda m: "the most Cachet takes is" in json.dumps(m))
        assert "composer-text" not in got.puts, "only a send's or an edit's words go back in the box"
    await communicator.send_to(text_data="[" * 150_000)
    await until(communicator, got, lambda m: "not JSON" in json.dumps(m))
    assert model.requests == []
    assert await database_sync_to_async(Turn.objects.count)() == 0
    await communicator.disconnect()


async def test_streamed_text_goes_straight_to_the_socket_and_the_tabs_own_requests_go_through_the_store_check(
    live_session: ChatSession, ada_cookie: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import channels.consumer

    hops: list[str] = []
    plain = channels.consumer.aclose_old_connections

    async def counted() -> None:
        hops.append("close old connections")
        await plain()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    communicator, got = await connected(live_session.pk, ada_cookie)
    layer = get_channel_layer()
    assert layer is not None
    hops.clear()
    for number in range(3):
        piece = wire.delta_message(live_session.pk, turn=1, step=1, text=f"n{number} ", at=3 * number, reasoning=False)
        await layer.group_send(wire.session_group(live_session.pk), piece)
    for _ in range(3):
        got.take(await communicator.receive_from(timeout=5))
    assert got.text[(1, 1)] == "n0 n1 n2 "
    assert hops == []
    await communicator.send_json_to({"type": "mode", "mode": "plan"})
    await until(communicator, got, lambda m: "takes effect as a note" in json.dumps(m))
    assert hops == ["close old connections"]
    await communicator.disconnect()


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
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Hi"})
    await until(communicator, got, idle)
    assert 'data-status="failed"' in got.puts["turn-1"]
    assert "exploded" in got.puts["turn-1"] and 'class="retry"' in got.puts["turn-1"]
    model.push(Step(text="Summary of it."))
    await communicator.send_json_to({"type": "compact"})
    await until(communicator, got, idle)
    assert 'class="compaction"' in got.puts["compaction-2"]
    assert "Compacted" in got.puts["notice"]
    await communicator.send_json_to({"type": "compact"})
    await until(communicator, got, lambda m: "nothing to compact" in json.dumps(m).lower())
    await until(communicator, got, idle)
    await communicator.disconnect()
    assert json.loads(model.requests[-1])["messages"][-1]["role"] == "user"


async def test_changing_the_model_shows_in_every_tab_and_the_next_request_is_a_model_change(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(text="One."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "First"})
    await until(communicator, got, idle)
    seen, first_bar = got.rev, max(int(key.removeprefix("bar-")) for key in got.puts if key.startswith("bar-"))
    watcher, theirs = await connected(live_session.pk, ada_cookie, rev=seen, first=1, bar=first_bar)
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as other:
        bigger = await database_sync_to_async(ModelEndpoint.objects.create)(
            name="bigger", base_url=other.base_url, context_window=32768
        )
        await communicator.send_json_to({"type": "model", "endpoint": f"{bigger.pk}:beta", "model": ""})
        await until(watcher, theirs, lambda m: "The model is now beta" in json.dumps(m))
        assert '<span class="model-name">beta</span>' in theirs.puts["model-control"]
        new_scale = "<span>prompt, share of the 32,768 token window</span>"
        assert new_scale in theirs.puts["chart"], "the chart is drawn again on the new context window"
        await until(communicator, got, lambda m: "The model is now beta" in json.dumps(m))
        session = await database_sync_to_async(ChatSession.objects.get)(pk=live_session.pk)
        assert (session.endpoint_id, session.model_name, session.generation_number) == (bigger.pk, "beta", 2)
        assert theirs.rev == session.revision
        generation = await database_sync_to_async(session.generations.get)(number=2)
        assert generation.model_name == "beta"
        other.push(Step(text="Two, from beta."))
        await communicator.send_json_to({"type": "send", "text": "Second"})
        await until(communicator, got, idle)
        assert json.loads(other.requests[0])["model"] == "beta" and len(model.requests) == 1
    bar = next(html for key, html in got.puts.items() if key.startswith("bar-") and int(key[4:]) > first_bar)
    assert 'data-cause="model_change"' in bar
    causes = await database_sync_to_async(
        lambda: list(
            ModelRequest.objects.filter(session=live_session).order_by("id").values_list("break_cause", "model_name")
        )
    )()
    assert causes == [("first", "scripted"), ("model_change", "beta")]
    await watcher.disconnect()
    late, caught = await connected(live_session.pk, ada_cookie, rev=seen, first=1, bar=first_bar)
    assert '<span class="model-name">beta</span>' in caught.puts["model-control"], "a tab that was away catches up"
    assert new_scale in caught.puts["chart"]
    await late.disconnect()
    await communicator.disconnect()


async def test_retry_with_another_model_asks_the_last_message_again_on_it_in_one_step(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    model.push(Step(fault="http500", text="boom"))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Try me"})
    await until(communicator, got, idle)
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as other:
        bigger = await database_sync_to_async(ModelEndpoint.objects.create)(
            name="other", base_url=other.base_url, context_window=8192
        )
        other.push(Step(text="Done, on beta."))
        frame = {"type": "model", "endpoint": f"{bigger.pk}:beta", "model": "", "retry": "1"}
        await communicator.send_json_to(frame)
        await until(communicator, got, says("The model is now beta"))
        await until(communicator, got, lambda m: idle(m) and "Done, on beta." in json.dumps(got.puts))
        body = json.loads(other.requests[0])
    assert body["model"] == "beta" and body["messages"][-1]["content"].startswith("Try me")
    turns = await database_sync_to_async(
        lambda: list(Turn.objects.filter(session=live_session).order_by("number").values_list("status", "reply_text"))
    )()
    assert turns == [("taken_back", ""), ("done", "Done, on beta.")], "the failed turn stays, as a branch"
    await communicator.disconnect()


async def test_a_model_too_small_for_the_conversation_is_refused_before_anything_breaks(
    live_session: ChatSession, ada_cookie: str, model: ScriptedServer
) -> None:
    """Switched to a 4,096-token model, a long session was stuck: Retry was refused with advice to Compact now, and
    Compact now failed the same way (its own request was the whole conversation). The switch is refused first,
    the model stays, and the way out (compact here, then switch) works."""
    model.push(Step(text="A long answer. " * 900))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Tell me everything"})
    await until(communicator, got, idle)
    small = await database_sync_to_async(ModelEndpoint.objects.create)(
        name="small", base_url="http://127.0.0.1:9/v1", context_window=2048
    )
    frame = {"type": "model", "endpoint": f"{small.pk}:tiny", "model": "", "retry": "1"}
    await communicator.send_json_to(frame)
    await until(communicator, got, says("tiny on small cannot take this conversation"))
    assert "that window is 2,048 tokens, as configured" in got.raw[-1] and "The model stays scripted" in got.raw[-1]
    session = await database_sync_to_async(ChatSession.objects.get)(pk=live_session.pk)
    assert (session.endpoint_id, session.model_name) == (live_session.endpoint_id, "scripted")
    assert len(model.requests) == 1, "nothing was asked again on the model that cannot take it"
    await communicator.disconnect()


def says(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda message: text in json.dumps(message)


async def test_the_model_is_not_changed_while_a_reply_runs_nor_by_a_wrong_message(
    live_session: ChatSession, ada_cookie: str, bob_cookie: str, model: ScriptedServer
) -> None:
    other = await database_sync_to_async(ModelEndpoint.objects.create)(name="other", base_url="http://127.0.0.1:9/v1")
    model.push(Step(text=LONG, chunk_size=3, delay=0.02))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Long one"})
    await until(communicator, got, lambda m: "live" in m)
    await communicator.send_json_to({"type": "model", "endpoint": other.pk, "model": "qwen"})
    await until(communicator, got, lambda m: "change the model once it has finished or been stopped" in json.dumps(m))
    await communicator.send_json_to({"type": "stop"})
    await until(communicator, got, idle)
    for message, answer in (
        ({"type": "model", "endpoint": "x"}, "Choose a model endpoint."),
        ({"type": "model", "endpoint": 999_999, "model": "m"}, "There is no model endpoint 999999."),
        ({"type": "model", "endpoint": other.pk, "model": "m" * 201}, "A model name is at most 200 characters."),
        ({"type": "model", "endpoint": f"{live_session.endpoint_id}:scripted"}, "The model is already scripted."),
    ):
        await communicator.send_json_to(message)
        await until(communicator, got, says(answer))
    intruder = socket(live_session.pk, bob_cookie)
    ok, _ = await intruder.connect()
    assert ok and await intruder.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}
    session = await database_sync_to_async(ChatSession.objects.get)(pk=live_session.pk)
    assert (session.endpoint_id, session.model_name, session.generation_number) == (
        live_session.endpoint_id,
        "scripted",
        1,
    )
    await communicator.disconnect()


def _remove_from_workspace(session: ChatSession, member: Any) -> None:
    """Staff make ``member`` the workspace's one member: the session's owner may no longer use it."""
    Workspace.objects.filter(pk=session.workspace_id).update(open_to_everyone=False)
    session.workspace.members.add(member)


REMOVED = "You are no longer a member of the workspace “ws”: this session is read-only."


def notice_says(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda message: any(op.get("id") == "notice" and text in op["html"] for op in message.get("ops", []))


async def test_a_removed_member_may_do_nothing_in_the_session_but_read_and_stop(
    live_session: ChatSession, ada_cookie: str, other_user: Any, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text=LONG, chunk_size=3, delay=0.02))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "First"})
    await until(communicator, got, idle)
    await communicator.send_json_to({"type": "send", "text": "Long one"})
    await until(communicator, got, lambda m: "live" in m)
    await database_sync_to_async(_remove_from_workspace)(live_session, other_user)
    await communicator.send_json_to({"type": "stop"})  # stopping is always allowed
    await until(communicator, got, idle)
    await communicator.send_json_to({"type": "send", "text": "Still here?"})
    await until(communicator, got, notice_says(REMOVED))
    assert ">Still here?</textarea>" in got.puts["composer-text"], "the words go back into the box"
    await communicator.send_json_to({"type": "edit", "turn": 1, "text": "Edited words"})
    await until(communicator, got, notice_says(REMOVED))
    assert ">Edited words</textarea>" in got.puts["composer-text"]
    endpoint = live_session.endpoint_id
    for message in (
        {"type": "undo", "restore": "1"},
        {"type": "regenerate"},
        {"type": "rewind", "turn": 1},
        {"type": "flip", "turn": 1},
        {"type": "compact"},
        {"type": "mode", "mode": "full"},
        {"type": "model", "endpoint": f"{endpoint}:bigger", "model": ""},
    ):
        got.puts.pop("notice", None)
        await communicator.send_json_to(message)
        await until(communicator, got, notice_says(REMOVED))
    assert await communicator.receive_nothing(timeout=0.3), "no job started"
    turns = await database_sync_to_async(lambda: list(Turn.objects.values_list("words", "status")))()
    assert turns == [("First", TurnStatus.DONE), ("Long one", TurnStatus.INTERRUPTED)]
    session = await database_sync_to_async(ChatSession.objects.get)(pk=live_session.pk)
    assert (session.mode, session.model_name, session.generation_number) == ("edit", "scripted", 1)
    assert len(model.requests) == 2
    await communicator.send_json_to({"type": "hello", "rev": 0, "first": 0, "bar": 0})
    await until(communicator, got, controls)
    assert "Long one" in got.html(), "the person's own turns still show"
    await communicator.disconnect()


async def test_a_removal_during_a_reply_fails_its_turn_in_every_tab(
    live_session: ChatSession, ada_cookie: str, other_user: Any, model: ScriptedServer
) -> None:
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(
            text="Reading it once more, slowly.", tool_calls=[("read", {"path": "notes.md"})], chunk_size=2, delay=0.03
        ),
        Step(text="never asked"),
    )
    communicator, got = await connected(live_session.pk, ada_cookie)
    watcher, theirs = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "Read notes"})
    await until(
        communicator, got, lambda m: any(key.startswith("call-") and "#0001" in html for key, html in got.puts.items())
    )
    await database_sync_to_async(_remove_from_workspace)(live_session, other_user)
    await until(communicator, got, idle)
    await until(watcher, theirs, idle)
    error = "the reply ended before its next tool call, and this session is read-only."
    for tab in (got, theirs):
        assert 'data-status="failed"' in tab.puts["turn-1"] and error in tab.puts["turn-1"]
    turn = await database_sync_to_async(Turn.objects.get)(session=live_session)
    assert turn.status == TurnStatus.FAILED and turn.reply_text.startswith("Reading.")
    results = await database_sync_to_async(lambda: list(live_session.results.values_list("number", flat=True)))()
    assert results == [1] and len(model.requests) == 2
    await watcher.disconnect()
    await communicator.disconnect()
