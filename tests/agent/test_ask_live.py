"""``ask`` from a terminal while a tab is open on the session: the reply streams into the tab (through the channel
layer, Postgres by default), and a Stop pressed in the tab stops it. With no worker alive, the ``ask`` process
runs the job itself; with one, the worker runs it: Ctrl-C in the terminal stops it there, and a terminal killed
mid-reply takes nothing with it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chat.tools import tool_list
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.process_kit import Process, cachet_env, start
from tests.web.test_consumers import connected, cookie_for, idle, until
from tests.worker_kit import running_worker

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

STORY = " ".join(f"story{n}" for n in range(300))


def _session(user: Any, folder: Path, model: ScriptedServer) -> ChatSession:
    workspace = Workspace.objects.create(name="told", folder=str(folder), allow_commands=False)
    workspace.members.add(user)
    endpoint = ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")
    return session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tool_list(allow_commands=False)
    )


async def test_a_turn_asked_from_a_terminal_streams_into_the_tab_and_the_tab_stops_it(
    user: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "ws"
    folder.mkdir()
    (tmp_path / "data").mkdir()
    with ScriptedServer(model="scripted") as model:
        session = await sync_to_async(_session)(user, folder, model)
        cookie = await sync_to_async(cookie_for)(user)
        tab, got = await connected(session.pk, cookie)
        model.push(Step(text=STORY, chunk_size=3, delay=0.005, pause_at=(60,)))
        env = cachet_env(data=tmp_path / "data", redis_url=None)
        asking = start(
            "ask",
            ["manage.py", "ask", "--user", user.username, "--session", str(session.pk), "Tell me a story"],
            env=env,
            logs=tmp_path,
        )
        try:
            assert await sync_to_async(model.wait_paused)(1, 60), asking.output()
            await until(tab, got, lambda m: "story10" in got.text.get((1, 1), ""), timeout=20)
            await tab.send_json_to({"type": "stop"})
            model.resume()
            await until(tab, got, idle, timeout=20)
            code = await asyncio.to_thread(asking.popen.wait, 30)
        except BaseException:
            print(asking.output())
            raise
        finally:
            asking.stop()
        output = asking.output()
        assert code == 1, output
        assert "Turn 1 interrupted: Stopped." in output
        assert output.rstrip().splitlines()[-1].startswith(f"session={session.pk} turn=1 requests=1 ")
        assert "story0 story1" in got.puts["turn-1"], "the tab shows the turn as stored"
        await tab.disconnect()


def _ask(user: Any, session: ChatSession, tmp_path: Path) -> Process:
    (tmp_path / "data").mkdir(exist_ok=True)
    command = ["manage.py", "ask", "--user", user.username, "--session", str(session.pk), "Tell me a story"]
    return start("ask", command, env=cachet_env(data=tmp_path / "data", redis_url=None), logs=tmp_path)


def _turn(session_id: int) -> tuple[str, str]:
    turn = Turn.objects.get(session_id=session_id, number=1)
    return turn.status, turn.reply_text


async def test_with_a_worker_alive_ctrl_c_in_the_terminal_stops_the_reply_the_worker_runs(
    user: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "ws"
    folder.mkdir()
    with ScriptedServer(model="scripted") as model:
        session = await sync_to_async(_session)(user, folder, model)
        tab, got = await connected(session.pk, await sync_to_async(cookie_for)(user))
        async with running_worker():
            model.push(Step(text=STORY, chunk_size=3, delay=0.005, pause_at=(60,)))
            asking = _ask(user, session, tmp_path)
            try:
                # Not sync_to_async: the worker starts each job through Django's one thread for sync code.
                assert await asyncio.to_thread(model.wait_paused, 1, 60), asking.output()
                await until(tab, got, lambda m: "story10" in got.text.get((1, 1), ""), timeout=20)
                await asyncio.to_thread(asking.wait_for, lambda output: "story10" in output)
                os.kill(asking.popen.pid, signal.SIGINT)
                await until(tab, got, idle, timeout=20)
                model.resume()
                code = await asyncio.to_thread(asking.popen.wait, 30)
            finally:
                asking.stop()
        output = asking.output()
        assert code == 1, output
        assert "Turn 1 interrupted: Stopped." in output
        assert output.rstrip().splitlines()[-1].startswith(f"session={session.pk} turn=1 requests=1 ")
        status, text = await sync_to_async(_turn)(session.pk)
        assert status == TurnStatus.INTERRUPTED and text.startswith("story0 story1")
        await tab.disconnect()


async def test_with_a_worker_alive_a_terminal_killed_mid_reply_takes_nothing_with_it(user: Any, tmp_path: Path) -> None:
    folder = tmp_path / "ws"
    folder.mkdir()
    with ScriptedServer(model="scripted") as model:
        session = await sync_to_async(_session)(user, folder, model)
        tab, got = await connected(session.pk, await sync_to_async(cookie_for)(user))
        async with running_worker():
            model.push(Step(text=STORY, chunk_size=3, delay=0.001, pause_at=(30,)))
            asking = _ask(user, session, tmp_path)
            try:
                assert await asyncio.to_thread(model.wait_paused, 1, 60), asking.output()
                asking.stop(signal.SIGKILL)
                model.resume()
                await until(tab, got, idle, timeout=20)
            finally:
                asking.stop()
        status, text = await sync_to_async(_turn)(session.pk)
        assert (status, text) == (TurnStatus.DONE, STORY)
        assert "story299" in got.puts["turn-1"], "the tab shows the whole reply, stored"
        await tab.disconnect()
