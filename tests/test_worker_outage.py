"""A ``manage.py worker`` process whose Postgres goes away (cut through a proxy, as when the server is down) waits
it out and reconnects: it is alive after a 20 s outage, runs the next queued job, and its log says the outage
began and ended, one line each, not a traceback per poll."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from chat.actions import Send
from chat.tools import tool_list
from chat.web import queueing
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.cachet.proxy_kit import Proxy, proxy
from tests.process_kit import cachet_env, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE_SECONDS = 20.0
RUNS_WITHIN = 5.0  # the job queued as Postgres comes back has run by then (it takes well under a second)
OUTAGE_AFTER = 12.0  # seconds after the worker is ready: its LISTEN's first check, 30 s in, falls in the outage


@pytest.fixture
def postgres_proxy() -> Iterator[Proxy]:
    params = connection.get_connection_params()
    host, port = str(params.get("host") or "/var/run/postgresql"), int(params.get("port") or 5432)
    target: tuple[str, int] | str = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
    with proxy(target) as made:
        yield made


def _proxied_url(through: Proxy) -> str:
    params = connection.get_connection_params()
    user = quote(str(params.get("user") or ""), safe="")
    password = quote(str(params.get("password") or ""), safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    return f"postgresql://{credentials}127.0.0.1:{through.port}/{quote(str(params['dbname']), safe='')}"


@pytest.fixture
def scripted_session(user: Any, tmp_path: Path) -> Iterator[tuple[ChatSession, ScriptedServer]]:
    folder = tmp_path / "ws"
    folder.mkdir()
    with ScriptedServer(model="scripted", when_empty=Step(fault="http500", text="script exhausted")) as model:
        workspace = Workspace.objects.create(name="outage", folder=str(folder), allow_commands=False)
        workspace.members.add(user)
        endpoint = ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")
        tools = tool_list(allow_commands=False)
        session = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tools)
        yield session, model


def _turns(session_id: int) -> list[tuple[int, str]]:
    return list(Turn.objects.filter(session_id=session_id).order_by("number").values_list("number", "status"))


def _until(check: Any, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_worker_waits_out_a_postgres_outage_and_runs_the_next_job_with_two_log_lines(
    scripted_session: tuple[ChatSession, ScriptedServer], postgres_proxy: Proxy, tmp_path: Path
) -> None:
    session, model = scripted_session
    (tmp_path / "data").mkdir()
    env = cachet_env(data=tmp_path / "data", redis_url=None, DATABASE_URL=_proxied_url(postgres_proxy))
    worker = start_worker("worker", env=env, logs=tmp_path)
    try:
        time.sleep(OUTAGE_AFTER)
        before = worker.output().splitlines()
        postgres_proxy.cut()
        time.sleep(OUTAGE_SECONDS)
        assert worker.popen.poll() is None, f"the worker exited during the outage:\n{worker.output()}"
        postgres_proxy.mend()
        back = time.monotonic()
        model.push(Step(text="Back again."))
        assert async_to_sync(queueing.start)(session.pk, Send(words="Still there?"), reply_to=None)
        _until(
            lambda: _turns(session.pk) == [(1, TurnStatus.DONE)],
            timeout=RUNS_WITHIN,
            what=f"the job queued after the outage did not run: {_turns(session.pk)}\n{worker.output()}",
        )
        print(f"the job queued as Postgres came back ran within {time.monotonic() - back:.1f} s")
        assert worker.popen.poll() is None
        during = worker.output().splitlines()[len(before) :]
        print(f"{len(during)} log lines across a {OUTAGE_SECONDS:g} s outage:\n" + "\n".join(during))
        assert not any("Traceback" in line for line in during), "\n".join(during)
        assert len(during) == 2, "\n".join(during)
        assert during[0].startswith("Postgres is out of reach (")
        assert during[1].startswith("Postgres answers again after")
    except BaseException:
        print(f"===== worker =====\n{worker.output()}")
        raise
    finally:
        worker.stop()
