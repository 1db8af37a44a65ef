"""The Caddy block that docs/deployment.md gives for several web processes, run by a real Caddy in front of two
``manage.py serve --no-worker``, one of them stopped: every page load and every websocket open reaches the one that
is up. Skipped where Caddy is not installed (``apt-get install caddy``)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cachet.cookies import cookie_names
from chat.tools import tool_list
from sessions_app.models import ModelEndpoint, Workspace
from sessions_app.services.sessions import session_start
from tests.passwords import give_shipped_password
from tests.process_kit import SECRET_KEY, Process, cachet_env, start

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("caddy") is None, reason="Caddy is not installed"),
]

ROOT = Path(__file__).resolve().parent.parent.parent
PASSWORD = "ada-password-1"
LISTENING = re.compile(r"Listening on TCP address [\d.]+:(\d+)")
PAGES, SOCKETS = 60, 30


def documented_block() -> str:
    """The Caddyfile block of docs/deployment.md for two web processes on ports 8001 and 8002."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    blocks = re.findall(r"^```\n(cachet\.lan \{\n.*?^\})\n```", text, re.S | re.M)
    [block] = [block for block in blocks if "reverse_proxy 127.0.0.1:8001 127.0.0.1:8002" in block]
    return str(block)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def two_web_processes(tmp_path: Path) -> Iterator[list[tuple[Process, int]]]:
    (tmp_path / "data").mkdir()
    env = cachet_env(data=tmp_path / "data", redis_url=None, CACHET_MODEL_URL="http://127.0.0.1:9/v1")
    ports = [_free_port(), _free_port()]
    webs = [
        (start(f"web-{port}", ["manage.py", "serve", "--no-worker", "--port", str(port)], env=env, logs=tmp_path), port)
        for port in ports
    ]
    try:
        for web, _ in webs:
            web.wait_for(lambda output: LISTENING.search(output) is not None, timeout=120)
        yield webs
    finally:
        for web, _ in webs:
            web.stop()


@pytest.fixture
def caddy(two_web_processes: list[tuple[Process, int]], tmp_path: Path) -> Iterator[str]:
    """Caddy with the documented block, on plain HTTP at a port of its own, in front of the two web processes."""
    port = _free_port()
    (_, first_port), (_, second_port) = two_web_processes
    block = documented_block().replace("127.0.0.1:8001", f"127.0.0.1:{first_port}")
    block = block.replace("127.0.0.1:8002", f"127.0.0.1:{second_port}")
    block = block.replace("cachet.lan {", f"http://127.0.0.1:{port} {{").replace("\ttls internal\n", "")
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text("{\n\tadmin off\n}\n" + block + "\n")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "caddy-data"), "XDG_CONFIG_HOME": str(tmp_path / "caddy")}
    log = (tmp_path / "caddy.log").open("wb")
    caddy = subprocess.Popen(
        ["caddy", "run", "--config", str(caddyfile), "--adapter", "caddyfile"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert caddy.poll() is None, (tmp_path / "caddy.log").read_text()
            try:
                if httpx.get(url + "/login/", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "caddy.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        os.killpg(caddy.pid, signal.SIGTERM)
        caddy.wait(timeout=10)
        log.close()


def _websocket(url: str, path: str, cookie: str) -> int:
    """The status a websocket open through Caddy gets (101: it opened)."""
    host, port = url.removeprefix("http://").split(":")
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: {url}\r\n"
        f"Cookie: {cookie_names(SECRET_KEY, tls=False).session}={cookie}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as stream:
        stream.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head and (chunk := stream.recv(1)):
            head += chunk
    return int(head.split(b" ", 2)[1]) if head else 0


def test_the_documented_caddy_block_skips_a_web_process_that_is_down(
    two_web_processes: list[tuple[Process, int]], caddy: str, django_user_model: Any, tmp_path: Path
) -> None:
    ada = django_user_model.objects.create_user(username="ada", password=None)
    give_shipped_password(ada, PASSWORD)
    folder = tmp_path / "ws"
    folder.mkdir()
    workspace = Workspace.objects.create(name="proxied", folder=str(folder), allow_commands=False)
    workspace.members.add(ada)
    endpoint = ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")
    tools = tool_list(allow_commands=False)
    session = session_start(owner=ada, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tools)
    with httpx.Client(base_url=caddy, timeout=30) as client:
        page = client.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None, page.text
        logged = client.post(
            "/login/",
            data={"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1), "next": "/"},
            headers={"Referer": caddy + "/login/"},
        )
        assert logged.status_code == 302, logged.text
        cookie = str(client.cookies[cookie_names(SECRET_KEY, tls=False).session])
        two_web_processes[1][0].stop()  # one of the two is down
        pages = [client.get(f"/sessions/{session.pk}/").status_code for _ in range(PAGES)]
    sockets = [_websocket(caddy, f"/ws/sessions/{session.pk}/", cookie) for _ in range(SOCKETS)]
    print(f"one web process of two down: {pages.count(200)} of {PAGES} page loads, {sockets.count(101)} of {SOCKETS}")
    assert pages == [200] * PAGES, pages
    assert sockets == [101] * SOCKETS, sockets
