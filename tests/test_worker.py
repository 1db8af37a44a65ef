"""Workers (``chat.worker.process``): replies run in ``manage.py worker`` processes; one killed mid-reply is
noticed within 2 s, its turn marked interrupted with the text it had streamed, every tab told, and the session takes
the next message at once: on the default layout (the Postgres channel layer, no Redis) and with Redis."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from cachet.redis_layer import RedisPubSubLayer, channel_prefix
from chat import wire
from chat.actions import Send
from chat.tools import tool_list
from chat.web import queueing
from chat.worker import process as worker
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from sessions_app.services.turns import step_draft_save, turn_start
from testing.scripted_server import ScriptedServer, Step
from tests.process_kit import Process, cachet_env, start, start_worker
from tests.redis_kit import RedisDatabase

pytestmark = pytest.mark.django_db(transaction=True)

STORY = " ".join(f"story{n}" for n in range(300))
NOTICED_WITHIN = 2.0  # a worker killed mid-reply: its turn interrupted, its tabs told, its session free again


def test_the_sweep_marks_interrupted_an_open_turn_no_process_replies_to(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="lost", today="2026-12-04", instructions=None)
    step_draft_save(turn=turn, number=1, text="Half a sent", reasoning="")
    ended = worker.sweep()
    assert [e.session_id for e in ended] == [chat_session.pk]
    turn.refresh_from_db()
    assert turn.status == TurnStatus.INTERRUPTED
    assert "Half a sent" in turn.reply_text
    assert ended[0].turn == (turn.pk, turn.revision), "the tabs are told which turn ended"
    assert worker.sweep() == [], "once"


@pytest.fixture
def redis_url(redis_database: RedisDatabase) -> Iterator[str]:
    redis_database.empty()
    try:
        yield redis_database.url
    finally:
        redis_database.empty()


@pytest.fixture
def story_session(user: Any, tmp_path: Path) -> Iterator[tuple[ChatSession, ScriptedServer]]:
    folder = tmp_path / "ws"
    folder.mkdir()
    with ScriptedServer(model="scripted", when_empty=Step(fault="http500", text="script exhausted")) as model:
        workspace = Workspace.objects.create(name="story", folder=str(folder), allow_commands=False)
        workspace.members.add(user)
        endpoint = ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")
        session = session_start(
            owner=user,
            workspace=workspace,
            endpoint=endpoint,
            model_name="scripted",
            tools=tool_list(allow_commands=False),
        )
        yield session, model


@pytest_asyncio.fixture(params=["postgres", "redis"])
async def layered(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, str | None]]:
    """A channel layer of the test process as a web process would have it, and the REDIS_URL the processes it
    reaches get: the default (Postgres, no Redis), or Redis where ``REDIS_URL`` is set."""
    if request.param == "postgres":
        layer = get_channel_layer()
        yield layer, None
        return
    redis_url = request.getfixturevalue("redis_url")
    layer = RedisPubSubLayer(
        hosts=[{"address": redis_url, "socket_timeout": settings.REDIS_SOCKET_TIMEOUT}],
        prefix=channel_prefix(redis_url),
    )
    yield layer, redis_url
    await layer.flush()


@pytest_asyncio.fixture
async def tab(layered: tuple[Any, str | None], story_session: tuple[ChatSession, ScriptedServer]) -> Tab:
    layer = layered[0]
    channel = await layer.new_channel()
    await layer.group_add(wire.session_group(story_session[0].pk), channel)
    return Tab(layer, channel)


class Tab:
    """The events a tab's web process gets for the session, through the channel layer."""

    def __init__(self, layer: Any, channel: str) -> None:
        self.layer = layer
        self.channel = channel
        self.events: list[dict[str, Any]] = []
        self.read = 0  # the events an earlier ``until`` looked at are not looked at again

    async def until(self, wanted: Callable[[dict[str, Any]], bool], *, timeout: float) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for at in range(self.read, len(self.events)):
                    if wanted(self.events[at]):
                        self.read = at + 1
                        return self.events[at]
                self.read = len(self.events)
                message = await self.layer.receive(self.channel)
                if message.get("type") == wire.EVENT:
                    self.events.append(dict(wire.checked(message)))

    def text(self) -> str:
        return "".join(event["text"] for event in self.events if event["event"] == "text")


def _idle(event: dict[str, Any]) -> bool:
    return bool(event["event"] == "job" and event["state"] == "idle")


def _turns(session_id: int) -> list[tuple[int, str, str]]:
    return list(Turn.objects.filter(session_id=session_id).order_by("number").values_list("number", "status", "error"))


def _reply_text(session_id: int) -> str:
    turn = Turn.objects.filter(session_id=session_id).order_by("number").first()
    return turn.reply_text if turn is not None else ""


def _draft_kept(session_id: int) -> bool:
    turn = Turn.objects.filter(session_id=session_id).order_by("number").first()
    return turn is not None and turn.drafts.exists()


@pytest.mark.asyncio
async def test_a_worker_killed_mid_reply_is_noticed_and_the_session_takes_the_next_message_within_2_s(
    story_session: tuple[ChatSession, ScriptedServer], layered: tuple[Any, str | None], tab: Tab, tmp_path: Path
) -> None:
    session, model = story_session
    env = cachet_env(data=tmp_path / "data", redis_url=layered[1])
    (tmp_path / "data").mkdir()
    workers: list[Process] = []
    try:
        workers.append(await sync_to_async(start_worker)("worker-a", env=env, logs=tmp_path))
        model.push(Step(text=STORY, chunk_size=3, delay=0.005, pause_at=(300,)))  # its draft saved (each second)
        username = await sync_to_async(lambda: session.owner.get_username())()
        ask = ["manage.py", "ask", "--user", username, "--session", str(session.pk), "Tell me a story"]
        asked = start("ask", ask, env=env, logs=tmp_path)  # a terminal following the reply
        workers.append(asked)
        assert await asyncio.to_thread(model.wait_paused, 1, 30), workers[0].output()
        # the worker that goes on is ready before the kill (the reply is already worker-a's): what is timed
        # below is the noticing, not a start
        workers.append(await sync_to_async(start_worker)("worker-b", env=env, logs=tmp_path))
        async with asyncio.timeout(10):
            while not await sync_to_async(_draft_kept)(session.pk):  # the streamed text is saved every second
                await asyncio.sleep(0.05)
        workers[0].stop(signal.SIGKILL)
        killed_at = time.monotonic()
        await tab.until(_idle, timeout=15)
        noticed = time.monotonic() - killed_at
        turns = await sync_to_async(_turns)(session.pk)
        assert [(number, status) for number, status, _ in turns] == [(1, TurnStatus.INTERRUPTED)], turns
        assert "story0 story1" in tab.text(), "the tab had the text the reply streamed"
        assert "story0 story1" in await sync_to_async(_reply_text)(session.pk), "and it is kept"
        model.resume()
        model.push(Step(text="And then it ended."))
        assert not await sync_to_async(queueing.busy)(session.pk), "the dead worker's job no longer holds the session"
        assert await queueing.start(session.pk, Send(words="Go on"), reply_to=None), "the next message is taken"
        await tab.until(lambda event: event["event"] == "turn_started" and event["number"] == 2, timeout=20)
        runs = time.monotonic() - killed_at
        await tab.until(lambda event: event["event"] == "turn_ended", timeout=20)
        await tab.until(_idle, timeout=20)
        turns = await sync_to_async(_turns)(session.pk)
        assert [(number, status) for number, status, _ in turns] == [
            (1, TurnStatus.INTERRUPTED),
            (2, TurnStatus.DONE),
        ], turns
        assert "And then it ended." in tab.text()
        print(f"killed worker noticed after {noticed:.2f} s; the next message ran {runs:.2f} s after the kill")
        assert noticed < NOTICED_WITHIN and runs < NOTICED_WITHIN, (noticed, runs)
        assert await asyncio.to_thread(asked.popen.wait, 30) == 1, asked.output()
        assert "The worker running it stopped" in asked.output() and "story0 story1" in asked.output()
        assert "Turn 1 interrupted" in asked.output()
        assert asked.output().rstrip().splitlines()[-1].startswith(f"session={session.pk} turn=1 requests=1 ")
    except BaseException:
        for process in workers:
            print(f"===== {process.name} =====\n{process.output()}")
        raise
    finally:
        for process in workers:
            process.stop()


def test_a_worker_runs_no_more_replies_at_once_than_postgres_has_connections_for() -> None:
    room = worker.connection_room()
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        row = cursor.fetchone()
    assert row is not None and 0 < room < int(row[0]), "the connections in use are counted"
    assert worker.concurrency_within(16, room=100) == 16
    assert worker.concurrency_within(100, room=63) == 63 - worker.OWN_CONNECTIONS
    assert worker.concurrency_within(16, room=3) == 1, "one reply at least"
