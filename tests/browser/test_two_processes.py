"""Two Cachet web processes and a worker behind one Redis: a reply asked through one web process runs in the
worker and streams to a tab served by the other, and a Stop pressed in that tab stops it. And the default layout,
``manage.py serve`` as ``./run`` starts it (Daphne and its worker, the Postgres channel layer), in a phone's
viewport.

Each process is in its own subprocess (Daphne, and ``manage.py worker``) on the test database (``DATABASE_URL``)
and on one Redis database (``REDIS_URL``), so the only ways between them are Redis (the channel layer's groups
``session-<id>`` and ``reply-<id>``) and Postgres (the task queue, the login session). The data is made before
Playwright starts (Django refuses the ORM in the thread Playwright's sync API runs in); checks in the middle of
the test go through :func:`in_thread`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from playwright.sync_api import expect

from sessions_app.models import BreakCause, ModelEndpoint, ModelRequest, Turn, TurnStatus, Workspace
from testing.scripted_server import ScriptedServer, Step
from tests.browser.browser_kit import (
    PASSWORDS,
    REPORT_VIOLATIONS,
    Launched,
    in_thread,
    login,
    watch_errors,
)
from tests.passwords import give_shipped_password
from tests.redis_kit import RedisDatabase

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)  # as the other browser tests

SECRET_KEY = "cachet-two-processes-test-secret-key-not-for-production"
START_TIMEOUT = 45.0
TIMEOUT_MS = 20_000

STREAMED = " ".join(f"word{n}" for n in range(60))
LONG_REPLY = " ".join(f"story{n}" for n in range(400))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _test_database_url() -> str:
    """A URL to the database the tests run on (pytest-django's test database), for the subprocesses."""
    params = connection.get_connection_params()  # where the embedded Postgres listens, too
    user = quote(str(params.get("user") or ""), safe="")
    password = quote(str(params.get("password") or ""), safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    name = quote(str(params["dbname"]), safe="")
    host = str(params.get("host") or "")
    port = str(params.get("port") or "")
    if host.startswith("/"):  # a unix socket directory, as the embedded Postgres uses
        query = f"host={quote(host, safe='')}" + (f"&port={port}" if port else "")
        return f"postgresql://{credentials}/{name}?{query}"
    return f"postgresql://{credentials}{host}{':' + port if port else ''}/{name}"


@dataclass
class Process:
    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Cluster:
    a: Process
    b: Process
    worker: Process

    def logs(self) -> str:
        return "\n".join(
            f"===== Cachet process {p.name} ({p.url}) =====\n{p.output()}" for p in (self.a, self.b, self.worker)
        )

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            print(self.logs())
            raise


@pytest.fixture
def redis_url(redis_database: RedisDatabase) -> Iterator[str]:
    redis_database.empty()
    try:
        yield redis_database.url
    finally:
        redis_database.empty()


def _wait_for_http(process: Process, deadline: float) -> None:
    while True:
        if process.popen.poll() is not None:
            raise RuntimeError(f"Cachet process {process.name} exited with {process.popen.returncode}")
        try:
            with urllib.request.urlopen(process.url + "/login/", timeout=2) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError:
            return  # it answers HTTP
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Cachet process {process.name} did not answer HTTP within {START_TIMEOUT:.0f} s")
        time.sleep(0.1)


def _stop(process: Process) -> None:
    if process.popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.popen.pid, signal.SIGTERM)
    try:
        process.popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait(timeout=5)


@pytest.fixture
def cluster(transactional_db: None, redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Two Daphne processes serving Cachet and a worker on the test database, with Redis as their channel layer."""
    ports = {"A": _free_port(), "B": _free_port()}
    while ports["B"] == ports["A"]:
        ports["B"] = _free_port()
    origins = [f"http://{host}:{port}" for port in ports.values() for host in ("127.0.0.1", "localhost")]
    data = tmp_path / "cachet-data"
    data.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "CACHET_DATA", "SECRET_KEY", "DEBUG", "PYTEST_CURRENT_TEST"}
    }
    env.update(
        DATABASE_URL=_test_database_url(),
        REDIS_URL=redis_url,
        CACHET_DATA=str(data),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        CSRF_TRUSTED_ORIGINS=",".join(origins),
        SECRET_KEY=SECRET_KEY,
        DJANGO_SETTINGS_MODULE="cachet.settings",
        PYTHONPATH=os.pathsep.join(filter(None, [str(settings.BASE_DIR), env.get("PYTHONPATH", "")])),
        PYTHONUNBUFFERED="1",
    )
    processes: list[Process] = []
    try:
        for name, port in ports.items():
            log = tmp_path / f"cachet-{name}.log"
            with log.open("wb") as out:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "cachet.asgi:application"],
                    cwd=settings.BASE_DIR,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, killed as one
                )
            processes.append(Process(name, f"http://127.0.0.1:{port}", popen, log))
        log = tmp_path / "cachet-worker.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "manage.py", "worker"],
                cwd=settings.BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Process("worker", "", popen, log)
        deadline = time.monotonic() + START_TIMEOUT
        for process in processes:
            try:
                _wait_for_http(process, deadline)
            except RuntimeError as error:
                raise RuntimeError(f"{error}\n{Cluster(processes[0], processes[1], worker).logs()}") from None
        while "Worker ready" not in worker.output():
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start\n{Cluster(processes[0], processes[1], worker).logs()}")
            time.sleep(0.05)
        processes.append(worker)
        yield Cluster(processes[0], processes[1], worker)
    finally:
        for process in processes:
            _stop(process)


@dataclass
class Setup:
    session_id: int
    model: ScriptedServer


@pytest.fixture
def setup(transactional_db: None, tmp_path: Path, django_user_model: Any) -> Iterator[Setup]:
    """Ada, a workspace, the scripted model server as the endpoint and a session, committed."""
    from chat.tools import tool_list
    from sessions_app.services.sessions import session_start

    folder = tmp_path / "workspace"
    folder.mkdir()
    (folder / "notes.md").write_text("".join(f"line {n} of the notes\n" for n in range(1, 41)))
    with ScriptedServer(model="scripted", when_empty=Step(fault="http500", text="script exhausted")) as model:
        ada = django_user_model.objects.create_user(username="ada", password=None)
        give_shipped_password(ada, PASSWORDS["ada"])  # the two Cachet processes check it
        workspace = Workspace.objects.create(name="demo", folder=str(folder.resolve()), allow_commands=False)
        endpoint = ModelEndpoint.objects.create(
            name="scripted", base_url=model.base_url, model="scripted", context_window=100_000
        )
        session = session_start(
            owner=ada,
            workspace=workspace,
            endpoint=endpoint,
            model_name="scripted",
            tools=tool_list(allow_commands=workspace.allow_commands),
        )
        yield Setup(session.pk, model)


@dataclass
class Chromium:
    context: Any
    sockets: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def page(self) -> Any:
        page = self.context.new_page()
        watch_errors(page, self.errors)
        page.on("websocket", lambda socket: self.sockets.append(socket.url))
        return page


@pytest.fixture
def chromium(setup: Setup, cluster: Cluster, launched: Launched) -> Iterator[Chromium]:
    """One browser context (so one login cookie) for both processes; opened after the data is made."""
    with launched.driving():
        context = launched.browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(TIMEOUT_MS)
        context.add_init_script(REPORT_VIOLATIONS)
        try:
            yield Chromium(context)
        finally:
            context.close()


def open_session(page: Any, url: str, session_id: int) -> None:
    """Open the session page and wait until its websocket is connected and the server sent the page's state."""
    page.goto(f"{url}/sessions/{session_id}/")
    expect(page.locator("#ws-status")).to_have_attribute("data-state", "open")
    expect(page.locator("#controls")).to_have_attribute("data-state", "idle")
    expect(page.locator("#send-button")).to_be_enabled()


def streaming(page: Any, turn: int, seen: str, not_yet: str) -> None:
    """Wait until the live text of ``turn`` shows ``seen`` while it does not yet show ``not_yet``."""
    page.wait_for_function(
        """([turn, seen, notYet]) => {
            const article = document.querySelector(`#turn-${turn}`);
            const stream = document.querySelector(`#stream-${turn}`);
            return article && article.dataset.status === "open" && stream
                && stream.textContent.includes(seen) && !stream.textContent.includes(notYet);
        }""",
        arg=[turn, seen, not_yet],
    )


def test_a_reply_started_in_one_process_streams_to_and_is_stopped_from_another(
    setup: Setup, cluster: Cluster, chromium: Chromium
) -> None:
    # Each answer stops in the middle until the test has seen it there (``pause_at``): with the answers paced by
    # time instead, a loaded machine showed the whole of one before the tab of B showed any part of it.
    setup.model.push(
        Step(text="Reading the notes first.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(text=STREAMED, chunk_size=3, delay=0.01, pause_at=(12,)),  # after "word0 … word5 "
        Step(text=LONG_REPLY, chunk_size=2, delay=0.01, pause_at=(40,)),  # after "story0 … story9 "
    )
    a, b, session_id = cluster.a, cluster.b, setup.session_id
    with cluster.logs_on_failure():
        first = chromium.page()
        login(first, a.url, "ada")
        open_session(first, a.url, session_id)
        second = chromium.page()  # same context: the login cookie (per host, not per port) counts on B too
        open_session(second, b.url, session_id)
        port_a, port_b = a.url.rsplit(":", 1)[1], b.url.rsplit(":", 1)[1]
        # both tabs sit idle past the channel layer's blocking pop on Redis (5 s), and keep their sockets
        second.wait_for_timeout(6_500)
        assert chromium.sockets == [
            f"ws://127.0.0.1:{port_a}/ws/sessions/{session_id}/",
            f"ws://127.0.0.1:{port_b}/ws/sessions/{session_id}/",
        ]

        # a reply asked through process A streams, token by token, to the tab served by process B
        first.fill("#composer-text", "What do the notes say?")
        first.press("#composer-text", "Enter")
        expect(second.locator("#turn-1 .words")).to_contain_text("What do the notes say?")
        expect(second.locator("#controls")).to_have_attribute("data-state", "running")
        assert setup.model.wait_paused(1)
        streaming(second, 1, "word3 ", "word59")
        setup.model.resume()
        tool = second.locator("#turn-1 .tool").first
        expect(tool.locator("summary")).to_contain_text("read")
        expect(tool.locator("summary")).to_contain_text("notes.md")
        expect(second.locator("#turn-1")).to_have_attribute("data-status", "done")
        expect(second.locator("#turn-1 .reply").last).to_contain_text("word59")
        expect(second.locator("#controls")).to_have_attribute("data-state", "idle")
        for page in (first, second):
            expect(page.locator("#turn-1 .tool summary")).to_have_text(
                re.compile(r"#0001\s+read\s+notes\.md\s+— lines 1-40 of 40")
            )
            expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
        assert len(setup.model.requests) == 2

        # a long reply asked through process A is stopped from the tab served by process B
        first.fill("#composer-text", "Tell me a long story")
        first.press("#composer-text", "Enter")
        assert setup.model.wait_paused(2), (
            len(setup.model.requests),
            first.locator("#notice").all_text_contents(),
            first.locator("#composer-text").input_value(),
            first.locator("#controls").get_attribute("data-state"),
            in_thread(lambda: list(Turn.objects.filter(session_id=session_id).values_list("number", "status"))),
        )
        streaming(second, 2, "story5 ", "story399")
        # a tab of process B that reloads mid-reply shows what the step streamed before it came back:
        # process A, which runs the reply, sends it through Redis
        second.reload()
        streaming(second, 2, "story0 story1 story2 ", "story399")
        expect(second.locator("#stop-button")).to_be_enabled()
        second.click("#stop-button")
        for page in (second, first):
            expect(page.locator("#turn-2")).to_have_attribute("data-status", "interrupted")
            expect(page.locator("#turn-2 .turn-error")).to_contain_text("Stopped.")
            expect(page.locator("#controls")).to_have_attribute("data-state", "idle")
        turn = in_thread(lambda: Turn.objects.get(session_id=session_id, number=2))
        assert turn.status == TurnStatus.INTERRUPTED
        assert "story5 " in turn.reply_text and "story399" not in turn.reply_text
        assert len(setup.model.requests) == 3
        # the suite's check that no request broke the prompt prefix unexpectedly only sees this process's rows
        causes = in_thread(lambda: list(ModelRequest.objects.filter(session_id=session_id).values_list("break_cause")))
        assert len(causes) == 3 and (BreakCause.UNEXPECTED,) not in causes, causes
        assert chromium.errors == []
        # no consumer failed on the way (an idle one once did, on Redis's read timeout, and its tab reconnected)
        assert "Exception inside application" not in cluster.logs()


@pytest.fixture
def served(transactional_db: None, tmp_path: Path) -> Iterator[Process]:
    """``manage.py serve`` as ``./run`` starts it: Daphne and one supervised worker, on the Postgres channel layer
    (no Redis), on the test database."""
    from tests.process_kit import cachet_env
    from tests.process_kit import start as start_process

    data = tmp_path / "served-data"
    data.mkdir()
    port = _free_port()
    env = cachet_env(
        data=data,
        redis_url=None,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        CSRF_TRUSTED_ORIGINS=f"http://127.0.0.1:{port}",
        CACHET_MODEL_URL="http://127.0.0.1:9/v1",
    )
    process = start_process("serve", ["manage.py", "serve", "--port", str(port)], env=env, logs=tmp_path)
    served = Process("serve", f"http://127.0.0.1:{port}", process.popen, process.log)
    try:
        process.wait_for(lambda output: "Worker ready" in output and "Cachet is serving" in output, timeout=90)
        _wait_for_http(served, time.monotonic() + START_TIMEOUT)
        yield served
    finally:
        process.stop()


def test_the_default_layout_a_web_process_and_its_worker_streams_and_stops_a_reply(
    setup: Setup, served: Process, launched: Launched
) -> None:
    setup.model.push(Step(text=LONG_REPLY, chunk_size=2, delay=0.01, pause_at=(40,)))
    try:
        with launched.driving():
            context = launched.browser.new_context(viewport={"width": 390, "height": 844})  # a phone's
            context.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            try:
                page = context.new_page()
                watch_errors(page, errors)
                login(page, served.url, "ada")
                open_session(page, served.url, setup.session_id)
                page.fill("#composer-text", "Tell me a long story")
                page.press("#composer-text", "Enter")
                assert setup.model.wait_paused(1)
                streaming(page, 1, "story5 ", "story399")
                page.click("#stop-button")
                setup.model.resume()
                expect(page.locator("#turn-1")).to_have_attribute("data-status", "interrupted")
                expect(page.locator("#controls")).to_have_attribute("data-state", "idle")
                assert errors == []
            finally:
                context.close()
    except BaseException:
        print(served.output())
        raise
    turn = in_thread(lambda: Turn.objects.get(session_id=setup.session_id, number=1))
    assert turn.status == TurnStatus.INTERRUPTED and "story5 " in turn.reply_text
