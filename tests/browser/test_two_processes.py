"""Two Cachet web processes and two workers behind one Redis, as a team runs them: a reply asked through one web
process runs in a worker and streams to a tab served by the other, a Stop pressed in that tab stops it, and a web
process killed and started again mid-reply loses nothing: the reply runs on in its worker and the reloaded tab
follows it to the end. And the default layout, ``manage.py serve`` as ``./run`` starts it (Daphne and its
worker, the Postgres channel layer), in a phone's viewport.

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
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
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
from tests.process_kit import Process, cachet_env
from tests.process_kit import start as start_process
from tests.redis_kit import RedisDatabase

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)  # as the other browser tests

START_TIMEOUT = 45.0
TIMEOUT_MS = 20_000

STREAMED = " ".join(f"word{n}" for n in range(60))
LONG_REPLY = " ".join(f"story{n}" for n in range(400))
TALE = " ".join(f"tale{n}" for n in range(80))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _web(name: str, port: int, *, env: dict[str, str], logs: Path) -> Process:
    """A Daphne process serving Cachet on ``port``, not yet waited for."""
    command = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "cachet.asgi:application"]
    return start_process(name, command, env=env, logs=logs, url=f"http://127.0.0.1:{port}")


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


def _stop_all(processes: list[Process]) -> None:
    """SIGTERM to every process at once, then each waited for (and killed if it will not stop)."""
    for process in processes:
        if process.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGTERM)
    for process in processes:
        process.stop()


@dataclass
class Cluster:
    a: Process
    b: Process
    workers: list[Process]
    env: dict[str, str]
    logs_dir: Path
    gone: list[Process] = field(default_factory=list)  # web processes stopped by the test, kept for their logs

    def processes(self) -> list[Process]:
        return [*self.gone, self.a, self.b, *self.workers]

    def logs(self) -> str:
        return "\n".join(f"===== Cachet process {p.name} ({p.url}) =====\n{p.output()}" for p in self.processes())

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            print(self.logs())
            raise

    def stop_a(self, sig: signal.Signals) -> None:
        """Stop web process A with ``sig``."""
        self.a.stop(sig)

    def start_a_again(self) -> None:
        """Start web process A again on its port, once it answers HTTP."""
        self.gone.append(self.a)
        port = int(self.a.url.rsplit(":", 1)[1])
        self.a = _web(f"A-{len(self.gone) + 1}", port, env=self.env, logs=self.logs_dir)
        _wait_for_http(self.a, time.monotonic() + START_TIMEOUT)


@pytest.fixture
def redis_url(redis_database: RedisDatabase) -> Iterator[str]:
    redis_database.empty()
    try:
        yield redis_database.url
    finally:
        redis_database.empty()


@pytest.fixture
def cluster(transactional_db: None, redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Two Daphne processes serving Cachet and two workers on the test database, with Redis as their channel
    layer, started at once."""
    ports = {"A": _free_port(), "B": _free_port()}
    while ports["B"] == ports["A"]:
        ports["B"] = _free_port()
    origins = [f"http://{host}:{port}" for port in ports.values() for host in ("127.0.0.1", "localhost")]
    data = tmp_path / "cachet-data"
    data.mkdir()
    env = cachet_env(
        data=data,
        redis_url=redis_url,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        CSRF_TRUSTED_ORIGINS=",".join(origins),
    )
    started: list[Process] = []
    cluster: Cluster | None = None
    try:
        for name, port in ports.items():
            started.append(_web(name, port, env=env, logs=tmp_path))
        for name in ("worker-1", "worker-2"):
            started.append(start_process(name, ["manage.py", "worker"], env=env, logs=tmp_path))
        cluster = Cluster(started[0], started[1], started[2:], env, tmp_path)
        deadline = time.monotonic() + START_TIMEOUT
        try:
            for web in (cluster.a, cluster.b):
                _wait_for_http(web, deadline)
            for worker in cluster.workers:
                worker.wait_for(lambda output: "Worker ready" in output, timeout=max(deadline - time.monotonic(), 0))
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n{cluster.logs()}") from None
        yield cluster
    finally:
        _stop_all(cluster.processes() if cluster is not None else started)


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
        workspace = Workspace.objects.create(
            name="demo", folder=str(folder.resolve()), allow_commands=False, open_to_everyone=True
        )
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


def test_a_reply_streams_to_and_is_stopped_from_another_process_and_outlives_a_web_restart(
    setup: Setup, cluster: Cluster, chromium: Chromium
) -> None:
    # Each answer stops in the middle until the test has seen it there (``pause_at``): with the answers paced by
    # time instead, a loaded machine showed the whole of one before the tab of B showed any part of it.
    setup.model.push(
        Step(text="Reading the notes first.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(text=STREAMED, chunk_size=3, delay=0.01, pause_at=(12,)),  # after "word0 … word5 "
        Step(text=LONG_REPLY, chunk_size=2, delay=0.01, pause_at=(40,)),  # after "story0 … story9 "
        Step(text=TALE, chunk_size=5, delay=0.005, pause_at=(12,)),  # after "tale0 … tale9 "
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
        # the worker that runs the reply sends it through Redis
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
        setup.model.resume()  # the stopped answer, still paused in the model server, ends (nobody reads it)

        # the web process a tab is on is killed mid-reply and started again on its port: the reply runs on in its
        # worker, and the tab, reloaded, follows it to the end
        first.fill("#composer-text", "Tell me a tale")
        first.press("#composer-text", "Enter")
        assert setup.model.wait_paused(3)
        streaming(first, 3, "tale5 ", "tale79")
        before_restart = len(chromium.errors)
        cluster.stop_a(signal.SIGKILL)
        expect(first.locator("#ws-status")).not_to_have_attribute("data-state", "open")
        streaming(second, 3, "tale5 ", "tale79")  # the tab on B is not troubled
        cluster.start_a_again()
        first.reload()
        expect(first.locator("#ws-status")).to_have_attribute("data-state", "open")
        # meanwhile the tab logged its attempts to connect again to the process that was down, and only those
        refused = chromium.errors[before_restart:]
        del chromium.errors[before_restart:]
        assert all(
            error == "console: [object Event]"
            or error.startswith(f"console: WebSocket connection to 'ws://127.0.0.1:{port_a}/ws/sessions/{session_id}/'")
            for error in refused
        ), refused
        streaming(first, 3, "tale0 tale1 tale2 ", "tale79")  # what the step streamed before, from the worker
        expect(first.locator("#controls")).to_have_attribute("data-state", "running")
        setup.model.resume()
        for page in (first, second):
            expect(page.locator("#turn-3")).to_have_attribute("data-status", "done")
            expect(page.locator("#turn-3 .reply").last).to_have_text(TALE)
            expect(page.locator("#controls")).to_have_attribute("data-state", "idle")
        turn = in_thread(lambda: Turn.objects.get(session_id=session_id, number=3))
        assert (turn.status, turn.reply_text, turn.error) == (TurnStatus.DONE, TALE, ""), "not interrupted"
        assert len(setup.model.requests) == 4, "the reply was asked of the model once"
        assert [worker.popen.poll() for worker in cluster.workers] == [None, None], "both workers still run"

        # the suite's check that no request broke the prompt prefix unexpectedly only sees this process's rows
        causes = in_thread(lambda: list(ModelRequest.objects.filter(session_id=session_id).values_list("break_cause")))
        assert len(causes) == 4 and (BreakCause.UNEXPECTED,) not in causes, causes
        assert chromium.errors == []
        # no consumer failed on the way (an idle one once did, on Redis's read timeout, and its tab reconnected)
        assert "Exception inside application" not in cluster.logs()


@pytest.fixture
def served(transactional_db: None, tmp_path: Path) -> Iterator[Process]:
    """``manage.py serve`` as ``./run`` starts it: Daphne and one supervised worker, on the Postgres channel layer
    (no Redis), on the test database."""
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
    command = ["manage.py", "serve", "--port", str(port)]
    served = start_process("serve", command, env=env, logs=tmp_path, url=f"http://127.0.0.1:{port}")
    try:
        served.wait_for(lambda output: "Worker ready" in output and "Cachet is serving" in output, timeout=90)
        _wait_for_http(served, time.monotonic() + START_TIMEOUT)
        yield served
    finally:
        served.stop()


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
