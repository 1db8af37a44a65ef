"""The database going away and coming back, with Cachet under Daphne in a subprocess and a Postgres this test
starts and stops itself (``pgserver``'s binaries, in a folder of its own): pages answer 503 with one line and no
path while it is away, websockets close cleanly, and both work again once it is back, without a restart.

The Postgres, its migrated database and the Daphne process are made once for the module."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from django.conf import settings

from cachet.cookies import cookie_names
from cachet.embedded_pg import import_pgserver
from cachet.outage import DATABASE_UNAVAILABLE_CLOSE
from sessions_app.errors import DATABASE_UNAVAILABLE
from tests.raw_websocket import HELLO, client_frame

ROOT = Path(settings.BASE_DIR)
SECRET_KEY = "cachet-outage-test-secret-key-not-for-production-0123456789"
SESSION_COOKIE = cookie_names(SECRET_KEY, tls=False).session  # the served Cachet's
PASSWORD = "ada-password-1"
START_TIMEOUT = 60.0
pytestmark = pytest.mark.xdist_group("db-outage")  # one test worker starts the module's Postgres and Cachet once


@dataclass
class Postgres:
    server: Any  # pgserver's PostgresServer
    socket_dir: str
    port: int

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={quote(self.socket_dir, safe='')}&port={self.port}"

    def stop(self) -> None:
        from pgserver._commands import POSTGRES_BIN_PATH

        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.server.pgdata), "-m", "fast", "-w", "stop"],
            user=self.server.system_user,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def connections_to(self, database: str) -> int:
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            row = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [database]
            ).fetchone()
            return int(row[0]) if row else 0


@dataclass
class Cachet:
    url: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path
    session_id: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A Postgres of this module's own. Not under pytest's tmp folder: as root, Postgres runs as the
    ``pgserver`` user, which must traverse the folders above its data."""
    pgserver = import_pgserver(Path(settings.CACHET_DATA))
    parent = Path(tempfile.mkdtemp(prefix="cachet-outage-test-"))
    server = pgserver.get_server(parent / "pg", cleanup_mode=None)
    info = server.get_postmaster_info()
    running = Postgres(server, str(info.socket_dir), int(info.port or 5432))
    try:
        with psycopg.connect(running.url("postgres"), autocommit=True) as connection:
            connection.execute("CREATE DATABASE cachet_outage")
        yield running
    finally:
        with contextlib.suppress(Exception):
            running.stop()
        shutil.rmtree(parent, ignore_errors=True)


def _environment(postgres: Postgres, data: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "CACHET_DATA", "SECRET_KEY", "DEBUG", "PYTEST_CURRENT_TEST"}
    }
    env.update(
        DATABASE_URL=postgres.url("cachet_outage"),
        CACHET_DATA=str(data),
        SECRET_KEY=SECRET_KEY,
        ALLOWED_HOSTS="127.0.0.1",
        DJANGO_SETTINGS_MODULE="cachet.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


SETUP = """
from django.contrib.auth.models import User
from sessions_app.models import ModelEndpoint, Workspace
from sessions_app.services.sessions import session_start
user = User.objects.create_user(username="ada", password={password!r})
workspace = Workspace.objects.create(name="ws", folder={folder!r})
endpoint = ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")
print(session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=[]).pk)
"""


@pytest.fixture(scope="module")
def cachet(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cachet]:
    """Cachet under Daphne on the module's Postgres, migrated, with ada and one session of hers."""
    folder = tmp_path_factory.mktemp("outage")
    (folder / "ws").mkdir()
    env = _environment(postgres, folder / "data")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=240)
    setup = SETUP.format(password=PASSWORD, folder=str(folder / "ws"))
    made = subprocess.run(
        [*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True, timeout=120, capture_output=True, text=True
    )
    port = _free_port()
    log = folder / "daphne.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "cachet.asgi:application"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Cachet(f"http://127.0.0.1:{port}", port, popen, log, int(made.stdout.strip().splitlines()[-1]))
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert popen.poll() is None, f"Daphne exited:\n{running.output()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(running.url + "/login/", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"Daphne did not answer:\n{running.output()}"
            time.sleep(0.2)
        yield running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)


def _logged_in(cachet: Cachet) -> httpx.Client:
    client = httpx.Client(base_url=cachet.url, timeout=20)
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token is not None
    response = client.post(
        "/login/",
        data={"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1), "next": "/"},
        headers={"Referer": cachet.url + "/login/"},
    )
    assert response.status_code == 302, response.text
    return client


@dataclass
class Handshake:
    status: int
    opcode: int | None = None
    payload: bytes = b""

    @property
    def close_code(self) -> int | None:
        return struct.unpack("!H", self.payload[:2])[0] if self.opcode == 8 and len(self.payload) >= 2 else None


def _read_exactly(stream: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed mid-frame")
        data += chunk
    return data


def _websocket(cachet: Cachet, client: httpx.Client) -> Handshake:
    """Open the session's websocket by hand, say hello as the page does, and read the first frame back."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /ws/sessions/{cachet.session_id}/ HTTP/1.1\r\nHost: 127.0.0.1:{cachet.port}\r\n"
        f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Origin: {cachet.url}\r\nCookie: {SESSION_COOKIE}={client.cookies[SESSION_COOKIE]}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", cachet.port), timeout=20) as stream:
        stream.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = stream.recv(1)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            return Handshake(status)
        stream.sendall(client_frame(HELLO))
        first, second = _read_exactly(stream, 2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", _read_exactly(stream, 2))[0]
        elif length == 127:
            length = struct.unpack("!Q", _read_exactly(stream, 8))[0]
        return Handshake(status, first & 0x0F, _read_exactly(stream, length))


def test_pages_and_websockets_survive_postgres_going_away_and_coming_back(postgres: Postgres, cachet: Cachet) -> None:
    client = _logged_in(cachet)
    assert client.get("/").status_code == 200
    before = _websocket(cachet, client)
    assert (before.status, before.opcode) == (101, 1)  # accepted, then the page's state as text

    postgres.stop()
    try:
        for path in ("/", f"/sessions/{cachet.session_id}/", "/login/"):
            page = client.get(path)
            assert page.status_code == 503, (path, page.text[:500])
            assert f"{DATABASE_UNAVAILABLE} Try again in a moment." in page.text
            assert page.headers["Retry-After"] == "5"
            for leak in (postgres.socket_dir, ".s.PGSQL", "/tmp", "Traceback", "psycopg"):
                assert leak not in page.text, (path, leak)
        during = _websocket(cachet, client)
        assert during.status in (101, 403)
        if during.status == 101:
            assert during.close_code == DATABASE_UNAVAILABLE_CLOSE
    finally:
        postgres.start()

    assert client.get("/").status_code == 200
    assert client.get(f"/sessions/{cachet.session_id}/").status_code == 200
    after = _websocket(cachet, client)
    assert (after.status, after.opcode) == (101, 1)
    log = cachet.output()
    assert "Exception inside application" not in log and "Traceback" not in log, log
    assert "database unavailable for GET /" in log and postgres.socket_dir in log  # the detail stays here


def test_connections_do_not_pile_up(postgres: Postgres, cachet: Cachet) -> None:
    client = _logged_in(cachet)
    for _ in range(30):
        assert client.get("/").status_code == 200
    open_connections = postgres.connections_to("cachet_outage")
    assert open_connections <= 2, f"{open_connections} connections open after 30 requests"
