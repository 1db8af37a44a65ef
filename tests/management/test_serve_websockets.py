"""Many tabs opening their websocket at once (a team coming back after a restart of Cachet or of its proxy), against
a real ``manage.py serve`` on a busy machine: every open succeeds. Daphne's defaults dropped them all: each open
waited behind the others' session lookups past Daphne's 5 s for a handshake, was cut, and the work done for it was
lost (400 at once: none opened)."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from cachet.cookies import cookie_names
from chat.tools import tool_list
from sessions_app.models import ModelEndpoint, Workspace
from sessions_app.services.sessions import session_start
from tests.passwords import give_shipped_password
from tests.serve_kit import SECRET_KEY, Served, served

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "ada-password-1"
AT_ONCE = 400
OPEN_SECONDS = 30.0  # a browser waits at least this long for a websocket to open
BUSY = 1  # processes that keep a core busy meanwhile, as the rest of a shared box does


@pytest.fixture
def cachet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served(tmp_path_factory.mktemp("serve-websockets"), "--no-worker") as running:
        yield running


@pytest.fixture
def descriptors() -> None:
    """Room for this process's end of every socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * AT_ONCE:
        if hard != resource.RLIM_INFINITY and hard < 4 * AT_ONCE:
            pytest.skip(f"{AT_ONCE} sockets need more open files than this process may have ({hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (4 * AT_ONCE, hard))


def _login(cachet: Served) -> str:
    """The session cookie of ada, logged in through the served Cachet."""
    names = cookie_names(SECRET_KEY, tls=False)
    with httpx.Client(base_url=cachet.url, timeout=60) as client:
        page = client.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None, page.text
        logged = client.post(
            "/login/",
            data={"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1), "next": "/"},
            headers={"Referer": cachet.url + "/login/"},
        )
        assert logged.status_code == 302, logged.text
        return str(client.cookies[names.session])


async def _open(url: str, path: str, cookie: str, took: list[float]) -> str:
    """Open the websocket as a logged-in tab: ``ok`` once Daphne answers 101, else what went wrong."""
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {address.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: {url}\r\n"
        f"Cookie: {cookie_names(SECRET_KEY, tls=False).session}={cookie}\r\n\r\n"
    )
    writer = None
    started = time.monotonic()
    try:
        async with asyncio.timeout(OPEN_SECONDS):
            reader, writer = await asyncio.open_connection(address.hostname, address.port)
            writer.write(request.encode())
            head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            return head.split(b"\r\n", 1)[0].decode(errors="replace")
        took.append(time.monotonic() - started)
        return "ok"
    except TimeoutError:
        return "timed out"
    except (OSError, asyncio.IncompleteReadError) as error:
        return type(error).__name__
    finally:
        if writer is not None:
            writer.close()


async def _open_all(url: str, path: str, cookie: str, took: list[float]) -> list[str]:
    return list(await asyncio.gather(*(_open(url, path, cookie, took) for _ in range(AT_ONCE))))


def test_four_hundred_websockets_opened_at_once_on_a_busy_machine_all_open(
    cachet: Served, descriptors: None, django_user_model: Any, tmp_path: Path
) -> None:
    ada = django_user_model.objects.create_user(username="ada", password=None)
    give_shipped_password(ada, PASSWORD)
    folder = tmp_path / "ws"
    folder.mkdir()
    workspace = Workspace.objects.create(name="many", folder=str(folder), allow_commands=False)
    workspace.members.add(ada)
    endpoint = ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")
    session = session_start(
        owner=ada, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tool_list(allow_commands=False)
    )
    cookie = _login(cachet)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY)]
    try:
        started = time.monotonic()
        each: list[float] = []
        outcomes = asyncio.run(_open_all(cachet.url, f"/ws/sessions/{session.pk}/", cookie, each))
        took = time.monotonic() - started
    finally:
        for process in busy:
            process.kill()
            process.wait()
    failed = {outcome: outcomes.count(outcome) for outcome in set(outcomes) if outcome != "ok"}
    each.sort()
    slowest = f"median {each[len(each) // 2]:.1f} s, slowest {each[-1]:.1f} s" if each else "none opened"
    print(f"{outcomes.count('ok')} of {AT_ONCE} websockets opened at once in {took:.1f} s ({slowest}); {failed}")
    assert outcomes.count("ok") == AT_ONCE, (failed, cachet.output()[-3000:])
