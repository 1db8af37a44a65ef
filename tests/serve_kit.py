"""Cachet as ``manage.py serve`` runs it, in a subprocess on the test database: its URL, its log, its memory, and
a client that streams a request body without holding it, to see how much of it the server lets in."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.db import connection

START_TIMEOUT = 90.0
BLOCK = 64 * 1024
LISTENING = re.compile(r"Listening on TCP address [\d.]+:(\d+)")
SECRET_KEY = "cachet-serve-kit-secret-key-not-for-production-0123456789"  # the served Cachet's (its cookie names)


def subprocess_database_url() -> str:
    """A URL to the database the tests run on (pytest-django's test database), for a subprocess."""
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


@dataclass(frozen=True)
class Memory:
    """A process's resident memory now and at its peak, in bytes (``VmRSS``, ``VmHWM``)."""

    rss: int
    peak: int


@dataclass
class Served:
    url: str
    data: Path
    popen: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def memory(self) -> Memory:
        status = Path(f"/proc/{self.popen.pid}/status").read_text()
        kilobytes = {key: int(value.split()[0]) for key, value in re.findall(r"^(VmRSS|VmHWM):\s+(.*)$", status, re.M)}
        return Memory(rss=kilobytes["VmRSS"] * 1024, peak=kilobytes["VmHWM"] * 1024)

    def reset_peak(self) -> None:
        """Bring the peak down to what the process holds now (Linux 4.0 and later)."""
        Path(f"/proc/{self.popen.pid}/clear_refs").write_text("5")


@contextlib.contextmanager
def served(data: Path, *options: str, **environment: str) -> Iterator[Served]:
    """``manage.py serve`` on a free loopback port of the test database, with ``options`` (``--no-worker``) and
    ``environment`` added, until the block ends. The test database must be one the subprocess sees: use it from
    ``transaction=True`` tests."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "CACHET_DATA", "SECRET_KEY", "DEBUG", "PYTEST_CURRENT_TEST"}
    }
    env.update(
        DATABASE_URL=subprocess_database_url(),
        CACHET_DATA=str(data),
        CACHET_WORKSPACE_ROOTS=str(data / "workspaces"),
        CACHET_MODEL_URL="http://127.0.0.1:9/v1",  # the discard port: nothing answers, at once
        SECRET_KEY=SECRET_KEY,
        ALLOWED_HOSTS="127.0.0.1",
        DJANGO_SETTINGS_MODULE="cachet.settings",
        PYTHONPATH=str(settings.BASE_DIR),
        PYTHONUNBUFFERED="1",
        **environment,
    )
    popen = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", "0", *options],
        cwd=settings.BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, stopped as one
    )
    assert popen.stdout is not None
    running = Served("", data, popen)
    port: list[int] = []
    listening = threading.Event()

    def drain(stream: Iterable[str]) -> None:
        for line in stream:
            running.lines.append(line)
            if not port and (match := LISTENING.search(line)):
                port.append(int(match.group(1)))
                listening.set()
        listening.set()  # it ended: the waiting ends too

    reader = threading.Thread(target=drain, args=(popen.stdout,), name="serve-output", daemon=True)
    reader.start()
    try:
        listening.wait(START_TIMEOUT)
        assert port, f"manage.py serve did not start listening:\n{running.output()}"
        running.url = f"http://127.0.0.1:{port[0]}"
        yield running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=15)
        reader.join(timeout=15)


@dataclass(frozen=True)
class Answer:
    """What a streamed request got: the status and body of the answer, and how many body bytes were sent."""

    status: int
    body: bytes
    sent: int


def blocks(size: int) -> Iterator[bytes]:
    """``size`` bytes of body, a block at a time."""
    block = b"x" * BLOCK
    for start in range(0, size, BLOCK):
        yield block[: min(BLOCK, size - start)]


def streamed_post(
    url: str, path: str, body: Iterable[bytes], *, length: int | None, headers: dict[str, str] | None = None
) -> Answer:
    """POST ``body`` to ``path``, with ``Content-Length: length``, or chunked where ``length`` is None, sending it
    only as long as the server has not answered; then read the answer to its end."""
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None
    head = f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\nConnection: close\r\n"
    head += "Transfer-Encoding: chunked\r\n" if length is None else f"Content-Length: {length}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    sent = 0
    with socket.create_connection((address.hostname, address.port), timeout=60) as connection:
        connection.sendall(f"{head}\r\n".encode())
        pending = b""
        pieces = iter(body)
        while True:
            if not pending:
                piece = next(pieces, None)
                if piece is None:
                    if length is None:
                        connection.sendall(b"0\r\n\r\n")
                    break
                pending = piece if length is not None else b"%x\r\n%b\r\n" % (len(piece), piece)
            readable, writable, _ = select.select([connection], [connection], [], 60)
            if readable:
                break  # the server answered, or closed
            if not writable:
                raise TimeoutError("the server neither reads nor answers")
            try:
                written = connection.send(pending)
            except OSError:  # the server closed while the body went on
                break
            sent += written
            pending = pending[written:]
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(BLOCK):
                answer += chunk
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1]) if head_bytes else 0
    return Answer(status=status, body=rest, sent=sent)
