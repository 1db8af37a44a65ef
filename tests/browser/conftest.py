"""Browser tests: Cachet under Daphne in a thread of the test process (so it sees the test database), with a
worker of the task queue on Daphne's event loop (so both share the in-memory channel layer), the project's
scripted model server, and Debian's Chromium driven by Playwright.

One Playwright and one Chromium serve all the browser tests of a test process; each test gets contexts of its
own. Playwright's sync API keeps an asyncio loop marked running in the test's thread, and Django refuses the
ORM there, so the mark is only on while a test drives the browser (:meth:`Launched.driving`): after the data is
made and until before pytest-django empties the database. Database work in the middle of a test goes through
:func:`in_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessions_app.models import ModelEndpoint, Workspace
from testing.scripted_server import ScriptedServer
from tests.browser.browser_kit import CHROMIUM, CHROMIUM_ARGS, PASSWORDS, Browser, Launched, World
from tests.worker_kit import running_worker


@pytest.fixture(scope="session")
def served(django_db_setup: None) -> Iterator[Served]:
    """Cachet's ASGI application served by Daphne on a free loopback port, for the whole session."""
    from chat.web.daphne_server import CachetServer  # installs Twisted's asyncio reactor: import it first

    # isort: split
    from twisted.internet import reactor

    from cachet.asgi import application

    server = CachetServer(
        application=application,
        endpoints=["tcp:port=0:interface=127.0.0.1"],
        signal_handlers=False,
        verbosity=0,
    )
    thread = threading.Thread(target=server.run, name="daphne", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.listening_addresses:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("Daphne did not start listening")
        time.sleep(0.02)
    _, port = server.listening_addresses[0]
    twisted: Any = reactor
    yield Served(f"http://127.0.0.1:{port}", twisted._asyncioEventloop)
    twisted.callFromThread(twisted.stop)
    thread.join(timeout=5)


@dataclass(frozen=True)
class Served:
    url: str
    loop: asyncio.AbstractEventLoop  # Daphne's


@pytest.fixture
def cachet_url(served: Served, transactional_db: None) -> Iterator[str]:
    """Cachet's address, with a worker of the task queue on Daphne's loop for the test (then it stops: a test
    that runs workers of its own has none in the test process)."""
    with worker_on(served.loop):
        yield served.url


@contextlib.contextmanager
def worker_on(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """A worker of the task queue on Daphne's event loop while the block runs."""
    stop = asyncio.Event()

    async def work() -> None:
        async with running_worker():
            await stop.wait()

    working = asyncio.run_coroutine_threadsafe(work(), loop)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        working.result(timeout=30)


@pytest.fixture
def world(transactional_db: None, cachet_url: str, tmp_path: Path, django_user_model: Any) -> Iterator[World]:
    folder = tmp_path / "workspace"
    folder.mkdir()
    (folder / "notes.md").write_text("".join(f"line {n} of the notes\n" for n in range(1, 41)))
    (folder / "app.py").write_text("def greet(name):\n    return 'hello ' + name\n")
    with ScriptedServer(model="scripted") as model:
        workspace = Workspace.objects.create(
            name="demo", folder=str(folder.resolve()), allow_commands=False, open_to_everyone=True
        )
        endpoint = ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")
        users = {
            name: django_user_model.objects.create_user(username=name, password=pw) for name, pw in PASSWORDS.items()
        }
        yield World(cachet_url, model, workspace, endpoint, folder.resolve(), users)


@pytest.fixture(scope="session")
def launched() -> Iterator[Launched]:
    """Chromium, launched once for the test process by Playwright's sync API."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (./test does it)")
    playwright = sync_playwright().start()
    running = Launched(playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS))
    try:
        yield running
    finally:
        with running.driving():
            running.browser.close()
            playwright.stop()


@pytest.fixture
def browser(world: World, launched: Launched) -> Iterator[Browser]:
    with launched.driving():
        held = Browser(world, launched.browser)
        try:
            yield held
        finally:
            for context in held.contexts:
                context.close()
    assert held.foreign_requests() == [], "a page asked another host"
    assert held.errors == [], "a page logged an error"
