"""Workers (``chat.worker.process``): replies run in ``manage.py worker`` processes; one killed mid-reply is
noticed, its turn marked interrupted with the text it had streamed, every tab told, and the session goes on: on the
default layout (the Postgres channel layer, no Redis) and with Redis."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from cachet.redis_layer import RedisPubSubLayer, channel_prefix
from chat.tools import tool_list
from chat.web import jobs
from chat.web.publisher import MESSAGE_TYPE, session_group
from chat.worker import process as worker
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from sessions_app.services.turns import step_draft_save, turn_start
from testing.scripted_server import ScriptedServer, Step
from tests.process_kit import Process, cachet_env, start, start_worker
from tests.redis_kit import RedisDatabase

pytestmark = pytest.mark.django_db(transaction=True)

STORY = " ".join(f"story{n}" for n in range(300))


def test_the_sweep_marks_interrupted_an_open_turn_no_process_replies_to(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="lost", today="2026-12-04", instructions=None)
    step_draft_save(turn=turn, number=1, text="Half a sent", reasoning="")
    ended = worker.sweep()
    assert [e.session_id for e in ended] == [chat_session.pk]
    turn.refresh_from_db()
    assert turn.status == TurnStatus.INTERRUPTED
    sent = "".join(ended[0].texts)
    assert "Half a sent" in sent
    assert 'data-state=\\"idle\\"' in sent, "the tabs are told the session is idle"
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
    await layer.group_add(session_group(story_session[0].pk), channel)
    return Tab(layer, channel)


class Tab:
    """What a tab of the session is sent, through the channel layer, as a web process would relay it."""

    def __init__(self, layer: Any, channel: str) -> None:
        self.layer = layer
        self.channel = channel
        self.texts: list[str] = []
        self.read = 0  # the messages an earlier ``until`` looked at are not looked at again

    async def until(self, wanted: str, *, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while True:
                for at in range(self.read, len(self.texts)):
                    if wanted in self.texts[at]:
                        self.read = at + 1
                        return
                self.read = len(self.texts)
                message = await self.layer.receive(self.channel)
                if message.get("type") == MESSAGE_TYPE:
                    self.texts.append(json.dumps(json.loads(message["text"]), ensure_ascii=False))


def _turns(session_id: int) -> list[tuple[int, str, str]]:
    return list(Turn.objects.filter(session_id=session_id).order_by("number").values_list("number", "status", "error"))


def _draft_kept(session_id: int) -> bool:
    turn = Turn.objects.filter(session_id=session_id).order_by("number").first()
    return turn is not None and turn.drafts.exists()


@pytest.mark.asyncio
async def test_a_worker_killed_mid_reply_is_noticed_and_the_session_goes_on(
    story_session: tuple[ChatSession, ScriptedServer], layered: tuple[Any, str | None], tab: Tab, tmp_path: Path
) -> None:
    session, model = story_session
    env = cachet_env(data=tmp_path / "data", redis_url=layered[1])
    (tmp_path / "data").mkdir()
    workers: list[Process] = []
    try:
        workers.append(await sync_to_async(start_worker)("worker-a", env=env, logs=tmp_path))
        model.push(Step(text=STORY, chunk_size=3, delay=0.005, pause_at=(120,)))
        username = await sync_to_async(lambda: session.owner.get_username())()
        ask = ["manage.py", "ask", "--user", username, "--session", str(session.pk), "Tell me a story"]
        asked = start("ask", ask, env=env, logs=tmp_path)  # a terminal following the reply
        workers.append(asked)
        assert await asyncio.to_thread(model.wait_paused, 1, 30), workers[0].output()
        # the worker that goes on starts meanwhile (the reply is already worker-a's)
        going_on = start("worker-b", ["manage.py", "worker"], env=env, logs=tmp_path)
        workers.append(going_on)
        async with asyncio.timeout(10):
            while not await sync_to_async(_draft_kept)(session.pk):  # the streamed text is saved every second
                await asyncio.sleep(0.05)
        workers[0].stop(signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.to_thread(going_on.wait_for, lambda output: "Worker ready" in output)
        await tab.until('data-state=\\"idle\\"', timeout=15)
        noticed = time.monotonic() - killed_at
        turns = await sync_to_async(_turns)(session.pk)
        assert [(number, status) for number, status, _ in turns] == [(1, TurnStatus.INTERRUPTED)], turns
        assert any("story0 story1" in text for text in tab.texts), "the tab shows the text the reply had streamed"
        model.resume()
        model.push(Step(text="And then it ended."))
        assert await jobs.start(session.pk, jobs.Send(words="Go on"), reply_to=None)
        await tab.until("And then it ended.", timeout=20)
        await tab.until('data-state=\\"idle\\"', timeout=20)
        turns = await sync_to_async(_turns)(session.pk)
        assert [(number, status) for number, status, _ in turns] == [
            (1, TurnStatus.INTERRUPTED),
            (2, TurnStatus.DONE),
        ], turns
        print(f"killed worker noticed after {noticed:.1f} s")
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
