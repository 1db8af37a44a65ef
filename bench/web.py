"""Long sessions and many people: Cachet's reply runtime before its rebuild (OLD, commit c1d4e61 by default,
``--old REV``, checked out into a temporary git worktree) against this working tree (NEW, copied as it is at the
start into a temporary folder, so that files edited meanwhile do not change a run; ``--live`` serves the working
tree in place), side by side in one run. It prints figures; it is not a test.

Each side gets its own data folder (its own embedded Postgres) and is served as a team deploys it: ``--webs``
real Daphne processes (1 by default) and ``--workers`` real ``manage.py worker`` processes (1 by default), on one
channel layer (``--layer``: Postgres, the default, or Redis). What a side can do is probed in its tree, not
assumed from its name: a tree without ``manage.py worker`` runs replies in Daphne (one web process then), one whose
socket knows no ``hello`` is taken in sync at its first message, one without ``stop`` is not timed stopping, and a
layer its settings do not know leaves it on its default (said). Both sides talk to the project's scripted model
server (``testing.scripted_server``, in a process of its own that notes the moment it writes each piece, each
request's arrival and last byte, and each call of its server API, on the machine's monotonic clock); it offers
``/apply-template`` and ``/tokenize`` (``n_ctx`` given), so every request that is due one gets its cache check,
as against llama.cpp. Sessions of 10, 100 and 1,000 turns (three reads of 300-line files and a short markdown
answer each, two model requests each on the chart) are built directly in each side's database through its own
store services. Then, for each side:

- **page**: ``GET /sessions/<id>/`` twice per size: time, bytes, and the server's peak memory over what it
  held before the request (``VmHWM`` after resetting it through ``/proc/PID/clear_refs``);
- **socket**: a websocket opened as the page opens it, until the tab is in sync (the answer to a hello naming
  what the page shows, and a cold hello naming nothing; a side without hello: its first message): bytes, the
  largest message, and whether it worked (the close code when not);
- **gap**: turns of ten steps (nine reads, then an answer) in the largest session: the time from the model's
  last byte of a step to the next request's arrival at the model server (the read tool's own time included),
  once with each tool call answered at once and once streamed over about 0.2 s, as a model takes time to write
  one (what the side does while the model works then stays out of the gap); the cache checks the model server
  was asked for meanwhile are counted;
- **streaming**: 1, 10, 50 and 100 sessions each asked at once for a reply of 100 pieces (``--pieces``) at 50
  pieces a second: time to the first piece at the tab's socket, relay latency (piece written by the model
  server to piece read from the tab's socket), CPU per streamed piece (a piece the model server wrote) of the
  web processes and of the workers, and errors (a tab that never went idle, closed, or showed an error; the
  failed sessions are listed). The CPU is given three ways: **all in** (the processes' CPU over the whole
  figure, reply starts and ends and cache checks included, over the pieces), **streaming only** (sampled every
  50 ms: only the intervals in which replies stream and none starts or ends and no cache check runs, over the
  pieces written in them) and that **less the idle processes' own** (their CPU over 3 s with the tabs open and
  nothing asked: timers, sweeps, polls); what the all-in CPU holds beyond the streaming is given per reply;
- **stop**: a reply streaming (sent by a tab on web 1, or a second tab where there is one web process), a tab on
  web 0 sends Stop: the time until the model server sees the reply's connection closed (a thread of the server
  watches that socket), and until the tab that sent shows the idle state; ``--stops`` of them (20), one after
  the other, with nothing else streaming.

With ``--webs M`` each side runs M Daphne processes on one data folder, ``SECRET_KEY`` and channel layer, as a
team deploys it behind a proxy. Pages, sockets and gaps use web 0. Each streaming session then has two tabs: the
one that sends is on web ``i % M``, the one measured on web ``(i + 1) % M``, so every piece crosses from the worker
to another process than the one that was asked; the web processes' CPU is summed over them (each piece then
reaches two tabs).

    .venv/bin/python bench/web.py [--quick] [--sides old,new] [--old REV] [--live] [--sizes 1000] [--streams 1]
        [--pieces 100] [--gap-turns 10] [--layer postgres|redis] [--workers N] [--webs M] [--concurrency N]
        [--stops 20] [--keep] [--profile DIR [--profile-running]]

``--quick`` uses sessions of 10 and 100 turns and 1, 10 and 50 sessions streaming (a few minutes); ``--sizes``
and ``--streams`` choose them; ``--gap-turns`` asks for more ten-step turns per gap figure (nine gaps each) than
the default three, for a steadier p95. ``--layer redis`` claims a database of the machine's Redis
(127.0.0.1:6379) for the run: the first empty one counted up from 1 (the tests count down from the last), marked
as taken in the step that finds it empty, emptied before each side and at the end. ``--concurrency`` sets
``CACHET_WORKER_CONCURRENCY`` of both sides' workers (16 by default, as deployed; each running reply holds a
database connection, and the embedded Postgres takes 100). ``--keep`` leaves the data folders (Daphne's and the
workers' logs) in place and says where. ``--profile DIR`` samples web 0 and each worker with py-spy during each
page, the (fast) gap and each streaming figure, into DIR's collapsed stacks, which ``bench/profile_summary.py``
sums up. An embedded Postgres still running once a side's processes have stopped is stopped, and said. The
machine's load average is printed before and after each side, and the figures end with the issue's targets,
met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import hashlib
import inspect
import itertools
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Git as Cachet runs it anywhere: no hooks, no fsmonitor, no pager named by a repository's own config.
OLD_COMMIT = "c1d4e61"  # the last commit before the reply runtime's rebuild (issue 37)
DEFAULT_PIECES = 100  # a streamed reply's pieces (``--pieces``, at most 1,000: the markers count them in three digits)
PIECES = DEFAULT_PIECES  # ``--pieces`` of this run
PIECE_DELAY = 0.02  # 50 pieces a second
TOOL_STEPS = 10
SLOW_CALL_DELAY = 0.03  # between a tool call's events (7 of 12 characters): about 0.2 s, as a model writes one
MARKER = re.compile(r"q\d{5}p\d{3}")
IDLE = re.compile(r'data-state=\\?"idle')
ERROR_NOTICE = re.compile(r'class=\\?"notice error')
FILE_LINES = 300
STOP_PIECES = 900  # a reply to stop: 18 s at 50 pieces a second, stopped long before its end
STREAM_TIMEOUT = 300.0  # the longest a streaming session's tabs wait for the idle state
OPEN_TIMEOUT = 60.0  # the longest a tab waits for its socket to open


# --- the model server (a process of its own) -----------------------------------------------------------------


def serve_model(port_file: Path) -> None:
    """The scripted server answering by what the last user message asks, noting when each piece goes out."""
    sys.path.insert(0, str(ROOT))
    from testing import scripted_server as scripted

    local = threading.local()
    lock = threading.Lock()
    pieces: dict[str, float] = {}
    requests: list[dict[str, Any]] = []
    checks: list[tuple[str, float]] = []  # the calls of the server API (a cache check asks both): path, moment
    # Prompt caching is imitated by tokenizing every prompt against every earlier one: far too slow for
    # prompts of a 1,000-turn session, and nothing here reads the figures it gives.
    scripted.tokenize = lambda text: text[:2000].split()

    class Server(scripted.ScriptedServer):
        def _record(self, body: bytes) -> int:
            number = super()._record(body)
            entry: dict[str, Any] = {"number": number, "arrived": time.monotonic(), "kind": "other"}
            local.entry = entry
            local.step = _step_for(scripted, body, number, entry)
            with lock:
                requests.append(entry)
            return number

        def _next_step(self) -> Any:
            return local.step

    handler: Any = scripted._Handler
    plain_event, plain_stream, plain_get, plain_post = handler._event, handler._stream, handler.do_GET, handler.do_POST

    def event(self: Any, data: Any) -> None:
        plain_event(self, data)
        try:
            content = data["choices"][0]["delta"].get("content") or ""
        except (KeyError, IndexError, TypeError):
            return
        if content:
            now = time.monotonic()
            with lock:
                for marker in MARKER.findall(content):
                    pieces.setdefault(marker, now)

    def stream(self: Any, answer: Any) -> None:
        entry = local.entry
        done = threading.Event()
        if entry["kind"] == "stop":
            threading.Thread(target=_watch_close, args=(self.connection, entry, lock, done), daemon=True).start()
        try:
            plain_stream(self, answer)
        except Exception:
            with lock:
                entry.setdefault("write_failed", time.monotonic())
            raise
        finally:
            done.set()
        entry["finished"] = time.monotonic()

    def get(self: Any) -> None:
        if self._path() == "/bench/times":
            with lock:
                taken = {"pieces": dict(pieces), "requests": list(requests), "checks": list(checks)}
                pieces.clear()
                requests.clear()
                checks.clear()
            self._send_json(200, taken)
            return
        plain_get(self)

    def post(self: Any) -> None:
        path = self._path()
        if path in ("/apply-template", "/tokenize"):
            with lock:
                checks.append((path, time.monotonic()))
        plain_post(self)

    handler._event, handler._stream, handler.do_GET, handler.do_POST = event, stream, get, post
    # n_ctx: the server offers /props, /apply-template and /tokenize as llama.cpp does, so every request of a side
    # that checks the cache (the new one) runs that check, as against a real server; the window is never reached.
    with Server(model="bench", n_ctx=100_000_000) as server:
        port_file.write_text(str(server.port))
        threading.Event().wait()  # until terminated


def _watch_close(connection: socket.socket, entry: dict[str, Any], lock: threading.Lock, done: threading.Event) -> None:
    """Note in ``entry["closed"]`` the moment the client closes the connection of a streamed answer (the
    client sends nothing more once its request is written: the socket turns readable only at its end)."""
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    while not done.is_set():
        if not poller.poll(50):
            continue
        now = time.monotonic()
        try:
            data = connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            with lock:
                entry.setdefault("closed", now)
            return
        done.wait(0.05)  # the client wrote something: look again later


def _step_for(scripted: Any, body: bytes, number: int, entry: dict[str, Any]) -> Any:
    try:
        messages = json.loads(body)["messages"]
    except (ValueError, KeyError, TypeError):
        return scripted.Step(text="?")
    last_user = max((i for i, message in enumerate(messages) if message.get("role") == "user"), default=0)
    words = json.dumps(messages[last_user].get("content"))
    if "BENCH-STOP" in words:
        entry["kind"] = "stop"
        text = " ".join(f"q{number:05d}p{k:03d}" for k in range(STOP_PIECES))
        return scripted.Step(text=text, chunk_size=11, delay=PIECE_DELAY)
    if "BENCH-STREAM" in words:
        entry["kind"] = "stream"
        text = " ".join(f"q{number:05d}p{k:03d}" for k in range(PIECES))
        return scripted.Step(text=text, chunk_size=11, delay=PIECE_DELAY)
    if "BENCH-TOOLS" in words:
        entry["kind"] = "tools"
        slow = "BENCH-TOOLS-SLOW" in words
        done = sum(1 for message in messages[last_user:] if message.get("role") == "tool")
        if done < TOOL_STEPS - 1:
            args = {"path": f"src/f{done % 3}.py", "offset": 1 + 20 * done, "limit": 100}
            if slow:
                return scripted.Step(tool_calls=[("read", args)], chunk_size=12, delay=SLOW_CALL_DELAY)
            return scripted.Step(tool_calls=[("read", args)])
        return scripted.Step(text="Read them all.")
    return scripted.Step(text="Fine.")


# --- building sessions in a side's database (run inside that side's tree) -------------------------------------


def build(spec_file: Path) -> None:
    """Make the user, the workspace and the sessions; print what the bench needs as one JSON line."""
    import importlib

    import django

    spec = json.loads(spec_file.read_text())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", interactive=False, verbosity=0)
    from django.db import connection

    with connection.cursor() as cursor:  # building only: no need to wait for the disk at each commit
        cursor.execute("SET synchronous_commit = off")
    setup: Any = importlib.import_module("sessions_app.services.setup")
    sessions: Any = importlib.import_module("sessions_app.services.sessions")
    turns: Any = importlib.import_module("sessions_app.services.turns")
    results: Any = importlib.import_module("sessions_app.services.results")
    workspace_module: Any = importlib.import_module("chat.agent.workspace")
    tools: Any = importlib.import_module("chat.tools")
    models: Any = importlib.import_module("sessions_app.models")
    auth: Any = importlib.import_module("django.contrib.auth")
    new_api = "number" in inspect.signature(turns.step_record).parameters

    user = auth.get_user_model().objects.create_user(username="bench", password="bench-password-1")
    client = Client()
    client.force_login(user)
    folder = Path(spec["workspace"])
    seeded = setup.workspaces_seed(spec=f"bench={folder}", default_folder=folder)
    workspace = (seeded if isinstance(seeded, list) else seeded.workspaces)[0]  # a list before the folder rules
    endpoint = setup.endpoint_seed(base_url=spec["model_url"], model="bench")
    tool_list = tools.tool_list(allow_commands=False)
    read_seconds: list[float] = []

    def new_session() -> Any:
        return sessions.session_start(
            owner=user, workspace=workspace, endpoint=endpoint, model_name="bench", tools=tool_list
        )

    def request(session: Any, turn: Any, step: int) -> None:
        models.ModelRequest.objects.create(
            session=session,
            turn=turn,
            step_number=step,
            endpoint_url=spec["model_url"],
            model_name="bench",
            body_sha256="0" * 64,
            bytes_sent=40_000 + 100 * turn.number,
            shared_prefix_bytes=39_000 + 100 * turn.number,
            status="done",
            prompt_tokens=2_000 + turn.number,  # under 80 % of the window: no compaction before the bench's turns
            cached_tokens=1_900 + turn.number,
            completion_tokens=120,
            time_to_first_token=0.4,
            total_time=2.0,
        )

    def add_turn(session: Any, index: int) -> None:
        turn = turns.turn_start(
            session=session, words=f"Question {index}: how do these fit?", today="2026-11-30", instructions=None
        )
        calls = [
            {"id": f"call_{turn.number}_1_{k}", "name": "read", "arguments": json.dumps({"path": f"src/f{k}.py"})}
            for k in range(3)
        ]
        first: dict[str, Any] = {
            "turn": turn,
            "text": "Reading the three files.",
            "reasoning": "",
            "tool_calls": calls,
            "finish_reason": "tool_calls",
        }
        step = turns.step_record(**first, number=1) if new_api else turns.step_record(**first)
        request(session, turn, 1)
        table: list[Any] = []
        for call in calls:
            if new_api:
                context = workspace_module.tool_context(session, table=table)
            else:
                context = workspace_module.tool_context(session, turn)
            started = time.perf_counter()
            arguments, outcome = tools.call_tool("read", call["arguments"], context)
            read_seconds.append(time.perf_counter() - started)
            extra = {"table": table} if new_api else {}
            result = results.result_insert(
                turn=turn,
                step=step,
                call_id=call["id"],
                tool="read",
                arguments=arguments,
                arguments_raw=call["arguments"],
                outcome=outcome,
                **extra,
            )
            table.append(results.prior_result(result))
        answer = (
            f"Turn {index}: the three files **fit** together.\n\n- `f0` reads\n- `f1` writes\n\n"
            "```python\ndef handler(event):\n    return event.id\n```\n"
        )
        last: dict[str, Any] = {
            "turn": turn,
            "text": answer,
            "reasoning": "",
            "tool_calls": [],
            "finish_reason": "stop",
        }
        if new_api:
            turns.step_record(**last, number=2)
            turns.turn_finish(turn=turn)
        else:
            turns.step_record(**last)
            turns.turn_finish(turn=turn, reply_text="Reading the three files.\n\n" + answer)
        request(session, turn, 2)

    sized: dict[str, int] = {}
    for size in spec["sizes"]:
        session = new_session()
        for index in range(size):
            add_turn(session, index)
        sized[str(size)] = session.pk
    streaming = [new_session().pk for _ in range(spec["streaming"])]
    request_selectors: Any = importlib.import_module("sessions_app.selectors.requests")
    build_ms: dict[str, float] = {}
    for size, session_id in sized.items():
        session = models.ChatSession.objects.get(pk=session_id)
        took: list[float] = []
        for _ in range(5):
            started = time.perf_counter()
            request_selectors.build_request(session, current=None, model_name="bench")
            took.append(time.perf_counter() - started)
        build_ms[size] = statistics.median(took) * 1000
    # The read tool's own time with the gap's arguments (100 lines from an offset), the context made once per
    # reply as the loop makes it: what the gap holds of the tool itself.
    gap_reads: list[float] = []
    if new_api and sized:
        session = models.ChatSession.objects.get(pk=sized[str(spec["sizes"][-1])])
        context = workspace_module.tool_context(session, table=[])
        for _ in range(20):
            for done in range(TOOL_STEPS - 1):
                arguments = json.dumps({"path": f"src/f{done % 3}.py", "offset": 1 + 20 * done, "limit": 100})
                started = time.perf_counter()
                tools.call_tool("read", arguments, context)
                gap_reads.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "gap_read_ms": [seconds * 1000 for seconds in gap_reads],
                "cookie": f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}",
                "sized": sized,
                "streaming": streaming,
                "read_ms": statistics.median(read_seconds) * 1000 if read_seconds else 0.0,
                "build_ms": build_ms,
                "queries_per_step": _queries_per_step(new_session()),
            }
        )
    )


def _queries_per_step(session: Any) -> float:
    """The database queries of one ten-step turn run by the side's own reply loop, per model request."""
    import importlib

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    loop: Any = importlib.import_module("chat.agent.loop")
    models: Any = importlib.import_module("sessions_app.models")
    with CaptureQueriesContext(connection) as captured:
        ran = loop.ReplyLoop(session).send("BENCH-TOOLS: read them one by one")
        if inspect.isgenerator(ran):  # a reply loop on a thread of its own (before the rebuild)
            for _ in ran:
                pass
        elif inspect.isasyncgen(ran):  # an async one: its store calls come back to this thread, whose queries count
            from asgiref.sync import async_to_sync

            async def drain() -> None:
                async for _ in ran:
                    pass

            async_to_sync(drain)()
    steps = models.ModelRequest.objects.filter(session=session).count()
    return len(captured.captured_queries) / steps if steps else float("nan")


# --- a websocket client, by hand --------------------------------------------------------------------------------


class Closed(Exception):
    def __init__(self, code: int | None) -> None:
        super().__init__(f"closed ({code})")
        self.code = code


@dataclass
class Tab:
    """One browser tab's socket: the messages it read, each with the moment its last byte arrived."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    got: list[tuple[float, str]] = field(default_factory=list)
    closed: int | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, port: int, path: str, cookie: str) -> Tab:
        async with asyncio.timeout(OPEN_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**26)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
                f"Cookie: {cookie}\r\n\r\n"
            ).encode()
        )
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except BaseException:
            writer.close()
            raise
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            raise Closed(None)
        tab = cls(reader, writer)
        tab.task = asyncio.get_running_loop().create_task(tab._read())
        return tab

    def send(self, data: dict[str, Any]) -> None:
        payload = json.dumps(data).encode()
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = bytes([0x81, 0x80 | length])
        elif length < 65536:
            header = bytes([0x81, 0x80 | 126]) + length.to_bytes(2, "big")
        else:
            header = bytes([0x81, 0x80 | 127]) + length.to_bytes(8, "big")
        self.writer.write(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    async def _frame(self) -> tuple[int, bool, bytes]:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(await self.reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await self.reader.readexactly(8), "big")
        return first & 0x0F, bool(first & 0x80), await self.reader.readexactly(length)

    async def _read(self) -> None:
        parts: list[bytes] = []
        try:
            while True:
                opcode, final, payload = await self._frame()
                if opcode == 0x8:
                    self.closed = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                    return
                if opcode == 0x9:
                    self.writer.write(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
                    continue
                if opcode in (0x1, 0x2, 0x0):
                    parts.append(payload)
                    if final:
                        self.got.append((time.monotonic(), b"".join(parts).decode("utf-8", "replace")))
                        parts = []
                        self.arrived.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed = self.closed or 1006
        finally:
            self.arrived.set()

    async def until(self, done: Any, *, start: int = 0, timeout: float) -> bool:
        """Wait until a message from index ``start`` on satisfies ``done``; False on close or timeout."""
        deadline = time.monotonic() + timeout
        seen = start
        while True:
            while seen < len(self.got):
                if done(self.got[seen][1]):
                    return True
                seen += 1
            if self.closed is not None:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


# --- one side -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Features:
    """What a side's tree can do, found in its files rather than assumed from its name."""

    workers: bool  # replies run in ``manage.py worker`` processes (else in Daphne, one web process)
    hello: bool  # a tab's socket is brought in sync by a hello naming what its page shows
    stop: bool  # a tab can stop the reply
    layers: frozenset[str]  # the channel layers its settings know (``CACHET_CHANNEL_LAYER``, ``REDIS_URL``)

    @classmethod
    def probe(cls, tree: Path) -> Features:
        def text(relative: str) -> str:
            with contextlib.suppress(OSError):
                return (tree / relative).read_text(errors="replace")
            return ""

        consumers, settings = text("chat/web/consumers.py"), text("cachet/settings.py")
        layers = set()
        if (tree / "cachet" / "pg_layer.py").exists() and "CACHET_CHANNEL_LAYER" in settings:
            layers.add("postgres")
        if (tree / "cachet" / "redis_layer.py").exists() and "REDIS_URL" in settings:
            layers.add("redis")
        return cls(
            workers=(tree / "chat" / "management" / "commands" / "worker.py").exists(),
            hello='"hello"' in consumers,
            stop='"stop"' in consumers,
            layers=frozenset(layers),
        )

    def said(self) -> str:
        return (
            f"{'workers' if self.workers else 'replies in Daphne'}, "
            f"{'hello' if self.hello else 'no hello'}, {'stop' if self.stop else 'no stop'}, "
            f"layers {', '.join(sorted(self.layers)) or 'none across processes'}"
        )


@dataclass
class Side:
    name: str
    tree: Path
    data: Path
    model_url: str
    env: dict[str, str] = field(default_factory=dict)
    layer_env: dict[str, str] = field(default_factory=dict)  # the new side's own (``--layer``, ``--concurrency``)
    ports: list[int] = field(default_factory=list)  # of the web processes, web 0 first
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)  # the Daphne processes
    built: dict[str, Any] = field(default_factory=dict)
    worker_count: int = 1
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    web_count: int = 1  # Daphne processes (``--webs``), all on the side's one data folder and channel layer
    features: Features = field(init=False)

    def __post_init__(self) -> None:
        self.features = Features.probe(self.tree)
        if not self.features.workers:
            self.web_count = 1  # replies run in Daphne: one process, nothing relays between processes
        self.env = {
            **os.environ,
            "PYTHONPATH": str(self.tree),
            "DJANGO_SETTINGS_MODULE": "cachet.settings",
            "CACHET_DATA": str(self.data),
            "XDG_RUNTIME_DIR": str(self.data / "run"),
            "CACHET_MODEL_URL": self.model_url,
            "CACHET_MODEL": "bench",
            "CACHET_TODAY": "2026-11-30",
            "SECRET_KEY": "bench-secret-key-" + "x" * 40,
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
        }
        self.env.pop("DATABASE_URL", None)
        self.env.pop("REDIS_URL", None)
        self.env.pop("CACHET_CHANNEL_LAYER", None)
        self.env.update(self.layer_env)

    def build(self, sizes: list[int], streaming: int, workspace: Path) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self.env["CACHET_WORKSPACE_ROOTS"] = str(workspace)  # the seeded folder lies under the roots
        spec = self.data / "spec.json"
        spec.write_text(
            json.dumps(
                {"model_url": self.model_url, "workspace": str(workspace), "sizes": sizes, "streaming": streaming}
            )
        )
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--build", str(spec)],
            cwd=self.tree,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{self.name}: building the sessions failed:\n{done.stderr[-4000:]}")
        self.built = json.loads(done.stdout.strip().splitlines()[-1])

    def start(self) -> None:
        for number in range(self.web_count):
            port = _free_port()
            with (self.data / f"daphne-{number}.log").open("wb") as log:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "cachet.asgi:application"],
                        cwd=self.tree,
                        env=self.env,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
            self.ports.append(port)
        for number, port in enumerate(self.ports):
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://127.0.0.1:{port}/login/", timeout=5).status_code < 500:
                        break
                if time.monotonic() > deadline or self.processes[number].poll() is not None:
                    raise SystemExit(f"{self.name}: Daphne did not answer; see {self.data / f'daphne-{number}.log'}")
                time.sleep(0.2)
        self._start_workers()

    def _start_workers(self) -> None:
        """Where replies run in workers (a tree with ``manage.py worker``): ``worker_count`` of them, as deployed."""
        if not self.features.workers:
            return
        logs = [self.data / f"worker-{number}.log" for number in range(self.worker_count)]
        for log_path in logs:
            with log_path.open("wb") as log:
                self.workers.append(
                    subprocess.Popen(
                        [sys.executable, "manage.py", "worker"], cwd=self.tree, env=self.env, stdout=log, stderr=log
                    )
                )
        deadline = time.monotonic() + 60
        while not all("Worker ready" in log.read_text(errors="replace") for log in logs):
            if time.monotonic() > deadline or any(worker.poll() is not None for worker in self.workers):
                raise SystemExit(f"{self.name}: a worker did not start; see {logs}")
            time.sleep(0.1)

    def worker_cpu(self) -> float:
        """The CPU seconds the side's workers have used (0 where replies run in Daphne)."""
        return sum(_cpu_seconds(worker.pid) for worker in self.workers)

    def web_cpu(self) -> float:
        """The CPU seconds the side's web processes have used, all of them."""
        return sum(_cpu_seconds(process.pid) for process in self.processes)

    def stop(self) -> None:
        for worker in self.workers:
            worker.send_signal(signal.SIGTERM)
        for number, worker in enumerate(self.workers):
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                print(f"  {self.name}: worker {number} had not stopped 30 s after SIGTERM; killed", flush=True)
                worker.kill()
                worker.wait()
        self.workers = []
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for number, process in enumerate(self.processes):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                print(f"  {self.name}: web {number} had not stopped 20 s after SIGTERM; killed", flush=True)
                process.kill()
                process.wait()
        self.processes, self.ports = [], []
        self._stop_stray_postgres()

    def _stop_stray_postgres(self) -> None:
        """Stop an embedded Postgres that outlived every process of the side. The last process to exit stops it
        (pgserver's atexit), but a web process's channel layer, losing its connection at that moment, has been
        seen to start it again on its way out; it would go on running on a deleted folder after the run."""
        pid_file = self.data / "pg" / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
            if str(self.data / "pg").encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return  # not this folder's server (the number was used again)
        except (OSError, ValueError, IndexError):
            return
        print(f"  {self.name}: the embedded Postgres (pid {pid}) outlived the side's processes; stopping it")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)  # Postgres's fast shutdown
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                return
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)

    @property
    def port(self) -> int:
        """Web 0's port: pages, sockets and gaps are measured there."""
        return self.ports[0]

    @property
    def pid(self) -> int:
        """Web 0's process."""
        return self.processes[0].pid

    @property
    def cookie(self) -> str:
        """The login's ``Cookie`` header: the side's session cookie, under its own name."""
        return str(self.built["cookie"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rss_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def _cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- the measurements ----------------------------------------------------------------------------------------------


@dataclass
class PageFigure:
    seconds: list[float]  # the first load, then the others
    cpu_seconds: list[float]  # Daphne's CPU time for each
    size: int
    memory_mb: float
    status: int
    html: str = ""


def measure_page(side: Side, session_id: int, loads: int = 3) -> PageFigure:
    url = f"http://127.0.0.1:{side.port}/sessions/{session_id}/"
    seconds: list[float] = []
    cpu: list[float] = []
    memory = 0.0
    size, status, html = 0, 0, ""
    for _ in range(loads):
        before = _rss_kb(side.pid, "VmRSS")
        with contextlib.suppress(OSError):
            Path(f"/proc/{side.pid}/clear_refs").write_text("5")
        cpu_before = _cpu_seconds(side.pid)
        started = time.perf_counter()
        response = httpx.get(url, headers={"Cookie": side.cookie}, timeout=600)
        seconds.append(time.perf_counter() - started)
        cpu.append(_cpu_seconds(side.pid) - cpu_before)
        memory = max(memory, (_rss_kb(side.pid, "VmHWM") - before) / 1024)
        size, status, html = len(response.content), response.status_code, response.text
    return PageFigure(seconds, cpu, size, memory, status, html)


@dataclass
class SocketFigure:
    ok: bool
    total: int
    largest: int
    seconds: float
    closed: int | None


def _page_state(html: str) -> dict[str, int]:
    rev = re.search(r'id="chat"[^>]*data-rev="(\d+)"', html)
    first = re.search(r'<article class="turn" id="turn-\d+" data-turn="(\d+)"', html)
    bars = re.findall(r'id="bar-(\d+)"', html)
    return {
        "rev": int(rev.group(1)) if rev else 0,
        "first": int(first.group(1)) if first else 0,
        "bar": int(bars[-1]) if bars else 0,
    }


def _synced(text: str) -> bool:
    return '"controls"' in text


async def measure_socket(side: Side, session_id: int, hello: dict[str, int] | None) -> SocketFigure:
    started = time.perf_counter()
    try:
        tab = await Tab.open(side.port, f"/ws/sessions/{session_id}/", side.cookie)
    except (Closed, OSError):
        return SocketFigure(False, 0, 0, time.perf_counter() - started, None)
    if side.features.hello:
        tab.send({"type": "hello", **(hello or {"rev": 0, "first": 0, "bar": 0})})
        ok = await tab.until(_synced, timeout=300)
    else:
        ok = await tab.until(lambda text: True, timeout=300)
    seconds = time.perf_counter() - started
    sizes = [len(text.encode()) for _, text in tab.got]
    await asyncio.sleep(0.2)
    closed = tab.closed
    await tab.close()
    return SocketFigure(ok and closed is None, sum(sizes), max(sizes, default=0), seconds, closed)


async def _model_times(model_port: int) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{model_port}/bench/times", timeout=30)
        result: dict[str, Any] = response.json()
        return result


async def _open_synced(side: Side, session_id: int, web: int = 0) -> Tab:
    """A tab of the session on web process ``web``, once it is in sync."""
    tab = await Tab.open(side.ports[web], f"/ws/sessions/{session_id}/", side.cookie)
    if side.features.hello:
        tab.send({"type": "hello", "rev": 0, "first": 0, "bar": 0})
        ok = await tab.until(_synced, timeout=300)
    else:
        ok = await tab.until(lambda text: True, timeout=300)
    if not ok:
        raise Closed(tab.closed)
    return tab


@dataclass
class GapFigure:
    gaps_ms: list[float]
    ok: bool
    via_tab: bool
    cpu_ms_per_step: float
    start_ms: list[float]  # from the tab's send to the turn's first request at the model (tabs only)
    worker_cpu_ms_per_step: float = float("nan")  # where replies run in workers
    checks: int = 0  # cache checks the model server was asked for (``/apply-template`` calls)
    requests: int = 0  # the model requests of the turns


async def measure_gap(
    side: Side, session_id: int, model_port: int, turns: int, *, words: str = "BENCH-TOOLS: read them"
) -> GapFigure:
    """Turns of ten steps asked from a tab; where the tab cannot open (OLD on a long session), with ``ask``."""
    tab: Tab | None
    try:
        tab = await _open_synced(side, session_id)
    except (Closed, OSError):
        tab = None
    gaps: list[float] = []
    starts: list[float] = []
    ok = True
    checks = asked_requests = 0
    await _model_times(model_port)
    cpu_before, worker_cpu_before = side.web_cpu(), side.worker_cpu()
    for _ in range(turns):
        checks += _template_calls(await _model_times(model_port))  # those of the turn before, come late
        sent = time.monotonic()
        if tab is not None:
            start = len(tab.got)
            tab.send({"type": "send", "text": words})
            ended = await tab.until(
                lambda text: bool(IDLE.search(text) or ERROR_NOTICE.search(text)), start=start, timeout=600
            )
            notices = [text for _, text in tab.got[start:] if ERROR_NOTICE.search(text)]
            if notices or not ended:
                print(f"  {side.name} gap: the turn failed: {_notice(notices[0]) if notices else 'no idle state'}")
            ok = ended and not notices and ok
        else:
            command = [sys.executable, "manage.py", "ask", "--user", "bench", "--session", str(session_id), words]
            asked = await asyncio.to_thread(
                subprocess.run, command, cwd=side.tree, env=side.env, capture_output=True, check=False
            )
            ok = ok and asked.returncode == 0
        await asyncio.sleep(0.3)
        times = await _model_times(model_port)
        checks += _template_calls(times)
        requests = [r for r in times["requests"] if r["kind"] == "tools"]
        asked_requests += len(requests)
        requests.sort(key=lambda r: r["arrived"])
        ok = ok and len(requests) == TOOL_STEPS
        if tab is not None and requests:
            starts.append((requests[0]["arrived"] - sent) * 1000)
        gaps.extend(
            (later["arrived"] - earlier["finished"]) * 1000
            for earlier, later in itertools.pairwise(requests)
            if "finished" in earlier
        )
    if tab is not None:
        await tab.close()
    await asyncio.sleep(1.0)  # the last turn's last checks
    checks += _template_calls(await _model_times(model_port))
    cpu = side.web_cpu() - cpu_before  # with ``ask`` the steps run elsewhere: not counted
    worker_cpu = side.worker_cpu() - worker_cpu_before
    steps = turns * TOOL_STEPS
    return GapFigure(
        gaps,
        ok,
        via_tab=tab is not None,
        cpu_ms_per_step=cpu * 1000 / steps,
        start_ms=starts,
        worker_cpu_ms_per_step=worker_cpu * 1000 / steps if side.workers else float("nan"),
        checks=checks,
        requests=asked_requests,
    )


def _notice(text: str) -> str:
    """An error notice's words, out of the page message that shows it."""
    found = re.search(r'notice-text\\?">(.*?)<', text)
    return found.group(1) if found else text[:300]


def _template_calls(times: dict[str, Any]) -> int:
    """The cache checks in the model server's notes: its ``/apply-template`` calls (a check asks it once)."""
    return sum(1 for path, _ in times.get("checks", []) if path == "/apply-template")


@dataclass
class StreamFigure:
    sessions: int
    first_piece_ms: list[float]
    relay_ms: list[float]
    cpu_ms_per_piece: float  # the web processes' CPU over the figure, per streamed piece (all in)
    errors: int
    missing_pieces: int
    seconds: float
    worker_cpu_ms_per_piece: float = float("nan")  # the workers' (where replies run in workers), all in
    failures: list[str] = field(default_factory=list)  # what went wrong, session by session
    pieces: int = 0  # streamed: the pieces the model server wrote
    tabs_per_piece: int = 1  # the tabs each piece reaches (2 where the sending tab is on another web process)
    steady: Steady | None = None  # the CPU while replies only stream
    checks: int = 0  # cache checks asked of the model server meanwhile

    def per_reply_ms(self, all_in: float, steady: float) -> float:
        """What the all-in CPU holds beyond the streaming itself, per reply: its start, its end, its check."""
        if self.steady is None or not self.sessions or all_in != all_in or steady != steady:
            return float("nan")
        return (all_in - steady) * self.pieces / self.sessions


@dataclass
class Steady:
    """The CPU of the intervals in which replies were streaming and none started or ended, and no cache check was
    asked, over the pieces written in them."""

    seconds: float
    pieces: int
    web_ms_per_piece: float
    worker_ms_per_piece: float
    idle_web_ms_per_s: float = float("nan")  # the processes' own CPU with the tabs open and nothing asked
    idle_worker_ms_per_s: float = float("nan")

    @property
    def web_ms_per_piece_beyond_idle(self) -> float:
        """The streaming CPU per piece less what the processes take anyway, idle (their timers, sweeps, polls)."""
        return self.web_ms_per_piece - self.idle_web_ms_per_s * self.seconds / self.pieces if self.pieces else NAN

    @property
    def worker_ms_per_piece_beyond_idle(self) -> float:
        return self.worker_ms_per_piece - self.idle_worker_ms_per_s * self.seconds / self.pieces if self.pieces else NAN


class CpuSampler:
    """The web processes' and the workers' CPU seconds every ``interval``, on a thread of the bench."""

    def __init__(self, side: Side, interval: float = 0.05) -> None:
        self.side = side
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.monotonic(), self.side.web_cpu(), self.side.worker_cpu()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(OSError, ValueError):
            self.samples.append((time.monotonic(), self.side.web_cpu(), self.side.worker_cpu()))


NAN = float("nan")
IDLE_SECONDS = 3.0  # the processes' idle CPU is sampled this long before the sends
START_MARGIN = 0.3  # before a request reaches the model: its job's start (the history read, the request built)
END_MARGIN = 0.3  # after its last byte: the answer stored, the turn ended
CHECK_MARGIN = 0.2  # around a call of the server API: the check's job on either side of it


def _steady(
    samples: list[tuple[float, float, float]],
    written: dict[str, float],
    requests: list[dict[str, Any]],
    checks: list[tuple[str, float]],
    sent: float,
) -> Steady:
    """The CPU per piece over the sampled intervals that hold only streaming (see ``Steady``)."""
    by_request: dict[int, list[float]] = {}
    for marker, moment in written.items():
        by_request.setdefault(int(marker[1:6]), []).append(moment)
    busy: list[tuple[float, float]] = [(sent, sent + 0.5)]  # the sends, and the tabs' messages saying so
    for request in requests:
        moments = by_request.get(int(request["number"]), [])
        if not moments:
            continue
        busy.append((request["arrived"] - START_MARGIN, min(moments) + 0.1))
        busy.append((max(moments) - 0.02, request.get("finished", max(moments)) + END_MARGIN))
    busy.extend((moment - CHECK_MARGIN, moment + CHECK_MARGIN) for _, moment in checks)
    moments = sorted(written.values())
    idle = [sample for sample in samples if sample[0] <= sent]
    idle_web = idle_worker = NAN
    if len(idle) >= 2 and idle[-1][0] > idle[0][0]:
        span = idle[-1][0] - idle[0][0]
        idle_web = (idle[-1][1] - idle[0][1]) * 1000 / span
        idle_worker = (idle[-1][2] - idle[0][2]) * 1000 / span
    seconds = web = worker = 0.0
    pieces = 0
    for (t0, web0, worker0), (t1, web1, worker1) in itertools.pairwise(samples):
        if t0 < sent:
            continue
        if any(start < t1 and t0 < end for start, end in busy):
            continue
        count = sum(1 for moment in moments if t0 < moment <= t1)
        if not count:
            continue
        seconds += t1 - t0
        pieces += count
        web += web1 - web0
        worker += worker1 - worker0
    return Steady(
        seconds,
        pieces,
        web * 1000 / pieces if pieces else NAN,
        worker * 1000 / pieces if pieces else NAN,
        idle_web,
        idle_worker,
    )


@dataclass
class _Asked:
    """A streaming session's tabs: the one that sends, and the one measured (another web process's, where the
    side has several; else the same tab), with where each one's messages after the send begin."""

    session_id: int
    sender: Tab
    watcher: Tab
    webs: tuple[int, int]
    sent: float = 0.0
    sender_start: int = 0
    watcher_start: int = 0

    @property
    def tabs(self) -> list[Tab]:
        return [self.sender] if self.watcher is self.sender else [self.sender, self.watcher]


def _idle(text: str) -> bool:
    return bool(IDLE.search(text))


async def _open_pair(side: Side, session_id: int, index: int) -> _Asked:
    webs = len(side.ports)
    sender = await _open_synced(side, session_id, web=index % webs)
    if webs == 1:
        return _Asked(session_id, sender, sender, (0, 0))
    try:
        watcher = await _open_synced(side, session_id, web=(index + 1) % webs)
    except BaseException:
        await sender.close()
        raise
    return _Asked(session_id, sender, watcher, (index % webs, (index + 1) % webs))


async def _both_idle(one: _Asked) -> tuple[bool, bool]:
    """Whether the measured tab, then the sending tab, showed the idle state."""
    if one.sender is one.watcher:
        idle = await one.watcher.until(_idle, start=one.watcher_start, timeout=STREAM_TIMEOUT)
        return idle, idle
    watcher, sender = await asyncio.gather(
        one.watcher.until(_idle, start=one.watcher_start, timeout=STREAM_TIMEOUT),
        one.sender.until(_idle, start=one.sender_start, timeout=STREAM_TIMEOUT),
    )
    return watcher, sender


async def measure_streaming(side: Side, session_ids: list[int], model_port: int) -> StreamFigure:
    asked: list[_Asked] = []
    failures: list[str] = []
    errors = 0
    for index, session_id in enumerate(session_ids):
        try:
            asked.append(await _open_pair(side, session_id, index))
        except (Closed, OSError, TimeoutError) as error:
            errors += 1
            failures.append(f"session {session_id}: a tab did not open ({error!r})")
    await _model_times(model_port)
    await asyncio.sleep(0.5)  # the tabs' own start (their hello answered) out of the CPU measured
    await _model_times(model_port)
    with CpuSampler(side) as sampler:
        await asyncio.sleep(IDLE_SECONDS)  # the processes' idle CPU, the tabs open
        cpu_before, worker_cpu_before = side.web_cpu(), side.worker_cpu()
        started = time.monotonic()
        for one in asked:
            one.sender_start, one.watcher_start = len(one.sender.got), len(one.watcher.got)
            one.sent = time.monotonic()
            one.sender.send({"type": "send", "text": "BENCH-STREAM: go"})
        done = await asyncio.gather(*(_both_idle(one) for one in asked))
        seconds = time.monotonic() - started
        await asyncio.sleep(1.0)  # the last replies' ends and cache checks
    cpu = side.web_cpu() - cpu_before
    worker_cpu = side.worker_cpu() - worker_cpu_before
    times = await _model_times(model_port)
    written: dict[str, float] = times["pieces"]
    streamed = [r for r in times["requests"] if r["kind"] == "stream"]
    first_piece: list[float] = []
    relay: list[float] = []
    received = 0  # pieces the measured tabs received
    for one, (watcher_idle, sender_idle) in zip(asked, done, strict=True):
        seen: dict[str, float] = {}
        notices: list[str] = []
        for arrived, text in one.watcher.got[one.watcher_start :]:
            if ERROR_NOTICE.search(text):
                notices.append(text[:300])
            for marker in MARKER.findall(text):
                seen.setdefault(marker, arrived)
        sender_seen: set[str] = set()
        if one.sender is not one.watcher:
            for _, text in one.sender.got[one.sender_start :]:
                if ERROR_NOTICE.search(text):
                    notices.append(text[:300])
                sender_seen.update(MARKER.findall(text))
        failed = not (watcher_idle and sender_idle) or any(tab.closed is not None for tab in one.tabs) or notices
        if one.sender is not one.watcher and len(sender_seen) < len(seen):
            failed = True
            notices.append(f"the sending tab got {len(sender_seen)} pieces, the watching one {len(seen)}")
        if failed:
            errors += 1
            failures.append(
                f"session {one.session_id} (sent on web {one.webs[0]}, watched on web {one.webs[1]}): watcher idle "
                f"{watcher_idle}, closed {one.watcher.closed}, {len(seen)}/{PIECES} pieces; sender idle "
                f"{sender_idle}, closed {one.sender.closed}; error notices {notices[:2]}"
            )
        received += len(seen)
        if seen:
            first_piece.append((min(seen.values()) - one.sent) * 1000)
        relay.extend((arrived - written[marker]) * 1000 for marker, arrived in seen.items() if marker in written)
        for tab in one.tabs:
            await tab.close()
    expected = PIECES * len(session_ids)
    pieces = len(written)
    nan = float("nan")
    return StreamFigure(
        len(session_ids),
        first_piece,
        relay,
        cpu * 1000 / pieces if pieces else nan,
        errors,
        expected - received,
        seconds,
        worker_cpu * 1000 / pieces if pieces and side.workers else nan,
        failures=failures,
        pieces=pieces,
        tabs_per_piece=1 if len(side.ports) == 1 else 2,
        steady=_steady(sampler.samples, written, streamed, times.get("checks", []), started),
        checks=_template_calls(times),
    )


@dataclass
class StopFigure:
    closed_ms: list[float]  # from the Stop sent to the model server seeing the reply's connection closed
    idle_ms: list[float]  # from the Stop sent to the other tab showing the idle state
    webs: tuple[int, int]  # the web process of the tab that stops, and of the one that sent and watches
    failures: list[str] = field(default_factory=list)


def _arrival(tab: Tab, done: Any, start: int) -> float:
    """When the first message from index ``start`` on that satisfies ``done`` arrived."""
    return next(arrived for arrived, text in tab.got[start:] if done(text))


async def measure_stop(side: Side, session_ids: list[int], model_port: int, count: int) -> StopFigure:
    """Stop a streaming reply from a tab on web 0, ``count`` times one after the other: the message sent by a tab
    on web 1 (a second tab of web 0 where there is one web process), which must then show the idle state."""
    webs = (0, 1 % len(side.ports))
    figure = StopFigure([], [], webs)
    for number in range(count):
        session_id = session_ids[number % len(session_ids)]
        try:
            stopper = await _open_synced(side, session_id, web=webs[0])
        except (Closed, OSError, TimeoutError) as error:
            figure.failures.append(f"stop {number}, session {session_id}: a tab did not open ({error!r})")
            continue
        try:
            other = await _open_synced(side, session_id, web=webs[1])
        except (Closed, OSError, TimeoutError) as error:
            figure.failures.append(f"stop {number}, session {session_id}: a tab did not open ({error!r})")
            await stopper.close()
            continue
        try:
            await _model_times(model_port)
            start = len(other.got)
            other.send({"type": "send", "text": "BENCH-STOP: go on until stopped"})
            if not await other.until(lambda text: bool(MARKER.search(text)), start=start, timeout=60):
                figure.failures.append(f"stop {number}, session {session_id}: the reply never streamed")
                continue
            await asyncio.sleep(0.3)
            start = len(other.got)
            sent = time.monotonic()
            stopper.send({"type": "stop"})
            if not await other.until(_idle, start=start, timeout=30):
                figure.failures.append(
                    f"stop {number}, session {session_id}: the other tab never showed the idle state "
                    f"(closed {other.closed})"
                )
                continue
            figure.idle_ms.append((_arrival(other, _idle, start) - sent) * 1000)
            await asyncio.sleep(0.2)
            stops = [r for r in (await _model_times(model_port))["requests"] if r["kind"] == "stop"]
            if len(stops) != 1 or "closed" not in stops[0]:
                figure.failures.append(
                    f"stop {number}, session {session_id}: the model server saw no connection closed ({stops})"
                )
                continue
            figure.closed_ms.append((stops[0]["closed"] - sent) * 1000)
        finally:
            await stopper.close()
            await other.close()
    return figure


# --- the run ---------------------------------------------------------------------------------------------------------


@dataclass
class SideFigures:
    pages: dict[int, PageFigure] = field(default_factory=dict)
    reconnect: dict[int, SocketFigure] = field(default_factory=dict)
    cold: dict[int, SocketFigure] = field(default_factory=dict)
    gap: GapFigure | None = None
    gap_slow: GapFigure | None = None
    streams: dict[int, StreamFigure] = field(default_factory=dict)
    stop: StopFigure | None = None
    read_ms: float = 0.0
    gap_read_ms: list[float] = field(default_factory=list)  # the read tool with the gap's arguments, in-process
    build_ms: dict[int, float] = field(default_factory=dict)
    queries_per_step: float = float("nan")
    load: tuple[str, str] = ("", "")  # the machine's load average before and after the side's figures
    features: Features | None = None


def _write_workspace(folder: Path) -> None:
    (folder / "src").mkdir(parents=True, exist_ok=True)
    for k in range(3):
        lines = [
            f"def handler_{k}_{n}(event):  # line {n} of the file f{k}.py, long enough to be real"
            for n in range(FILE_LINES)
        ]
        (folder / "src" / f"f{k}.py").write_text("\n".join(lines) + "\n")


def _new_tree(base: Path) -> Path:
    """A copy of the working tree as it is now (the files git tracks or would, deleted ones left out), so that what
    others edit meanwhile does not change the run; said with the commit it is on and a digest of its changes."""
    sys.path.insert(0, str(ROOT))
    from testing.safe_git import git_argv, git_env

    def git(*arguments: str) -> bytes:
        return subprocess.run(
            git_argv("-C", str(ROOT), *arguments), check=True, capture_output=True, env=git_env()
        ).stdout

    tree = base / "new-tree"
    files = [name for name in git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split(b"\0") if name]
    digest = hashlib.sha256()
    for name in sorted(files):
        source = ROOT / os.fsdecode(name)
        if not source.is_file():
            continue  # deleted in the working tree
        target = tree / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        digest.update(name + b"\0" + target.read_bytes())
    head = git("rev-parse", "--short", "HEAD").decode().strip()
    changed = len(git("status", "--porcelain", "-z").split(b"\0")) - 1
    print(f"new: the working tree on {head}, {changed} paths changed, copied (digest {digest.hexdigest()[:12]})")
    return tree


@contextlib.contextmanager
def _old_tree(base: Path, commit: str = OLD_COMMIT) -> Iterator[Path]:
    sys.path.insert(0, str(ROOT))
    from testing.safe_git import git_argv, git_env

    tree = base / "old-tree"
    subprocess.run(
        git_argv("-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit),
        check=True,
        capture_output=True,
        env=git_env(),
    )
    print(f"old: commit {commit}, in a worktree of its own", flush=True)
    try:
        yield tree
    finally:
        subprocess.run(
            git_argv("-C", str(ROOT), "worktree", "remove", "--force", str(tree)),
            check=False,
            capture_output=True,
            env=git_env(),
        )


@contextlib.contextmanager
def _model_server(base: Path) -> Iterator[int]:
    port_file = base / "model-port"
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--model-server", str(port_file), "--pieces", str(PIECES)],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the model server did not start")
            time.sleep(0.1)
        yield int(port_file.read_text())
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def _profiled(side: Side, name: str) -> Iterator[None]:
    """With ``--profile DIR``: py-spy samples Daphne (web 0) meanwhile, into DIR/SIDE-NAME.txt (collapsed stacks),
    and each worker of the side, into DIR/SIDE-NAME-worker-N.txt: the thread holding the GIL (CPU spent in Python;
    a thread waiting on a socket or a lock without the GIL is not sampled), or with ``--profile-running`` every
    thread the system shows running (py-spy's idle threads left out)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if PROFILE_DIR is None or spy is None:
        yield
        return
    targets = [(side.pid, PROFILE_DIR / f"{side.name}-{name}.txt")]
    targets += [
        (worker.pid, PROFILE_DIR / f"{side.name}-{name}-worker-{number}.txt")
        for number, worker in enumerate(side.workers)
    ]
    processes = [
        subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--format", "raw", *PROFILE_FLAGS, "--rate", "200", "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid, out in targets
    ]
    time.sleep(1)
    try:
        yield
    finally:
        for process in processes:
            process.send_signal(signal.SIGINT)
        for process in processes:
            process.wait(30)


PROFILE_DIR: Path | None = None
PROFILE_FLAGS: list[str] = ["--gil"]  # only the thread holding the GIL; none with ``--profile-running``


def run_side(
    side: Side, sizes: list[int], streams: list[int], gap_turns: int, model_port: int, stops: int = 0
) -> SideFigures:
    figures = SideFigures(
        read_ms=float(side.built.get("read_ms", 0.0)),
        gap_read_ms=[float(ms) for ms in side.built.get("gap_read_ms", [])],
        build_ms={int(size): float(ms) for size, ms in side.built.get("build_ms", {}).items()},
        queries_per_step=float(side.built.get("queries_per_step", float("nan"))),
        features=side.features,
    )
    load_before = _load()
    print(
        f"{side.name} ({side.tree}): {side.features.said()}; {len(side.ports) or side.web_count} web, "
        f"{side.worker_count if side.features.workers else 0} workers; load average {load_before}",
        flush=True,
    )
    side.start()
    try:
        for size in sizes:
            session_id = int(side.built["sized"][str(size)])
            with _profiled(side, f"page{size}"):
                page = measure_page(side, session_id)
            figures.pages[size] = page
            print(
                f"  {side.name} page {size} turns: {page.seconds[0]:.3f}s then {_again(page.seconds):.3f}s (CPU "
                f"{page.cpu_seconds[0]:.3f}s then {_again(page.cpu_seconds):.3f}s), "
                f"{page.size / 1e6:.2f} MB, +{page.memory_mb:.0f} MB, HTTP {page.status}",
                flush=True,
            )
            hello = _page_state(page.html)
            figures.reconnect[size] = asyncio.run(measure_socket(side, session_id, hello))
            if side.features.hello:
                figures.cold[size] = asyncio.run(measure_socket(side, session_id, None))
            got = figures.reconnect[size]
            print(
                f"  {side.name} socket {size} turns: ok={got.ok} {got.total / 1e6:.3f} MB, largest "
                f"{got.largest / 1e6:.3f} MB, closed={got.closed}, {got.seconds:.2f}s",
                flush=True,
            )
        largest = int(side.built["sized"][str(sizes[-1])])
        with _profiled(side, "gap"):
            figures.gap = asyncio.run(measure_gap(side, largest, model_port, gap_turns))
        print(
            f"  {side.name} gap: p50 {_pct(figures.gap.gaps_ms, 0.5):.1f} ms, p95 "
            f"{_pct(figures.gap.gaps_ms, 0.95):.1f} ms (n={len(figures.gap.gaps_ms)}, ok={figures.gap.ok}), "
            f"Daphne CPU {figures.gap.cpu_ms_per_step:.1f} ms/step, worker CPU "
            f"{figures.gap.worker_cpu_ms_per_step:.1f} ms/step, cache checks {figures.gap.checks} for "
            f"{figures.gap.requests} requests, reply start (send → first request) p50 "
            f"{_pct(figures.gap.start_ms, 0.5):.0f} ms",
            flush=True,
        )
        figures.gap_slow = asyncio.run(
            measure_gap(side, largest, model_port, gap_turns, words="BENCH-TOOLS-SLOW: read them")
        )
        print(
            f"  {side.name} gap, calls written over 0.2 s: p50 {_pct(figures.gap_slow.gaps_ms, 0.5):.1f} ms, p95 "
            f"{_pct(figures.gap_slow.gaps_ms, 0.95):.1f} ms (ok={figures.gap_slow.ok}), cache checks "
            f"{figures.gap_slow.checks} for {figures.gap_slow.requests} requests",
            flush=True,
        )
        for count in streams:
            ids = [int(i) for i in side.built["streaming"][:count]]
            with _profiled(side, f"stream{count}"):
                got_stream = asyncio.run(measure_streaming(side, ids, model_port))
            figures.streams[count] = got_stream
            steady = got_stream.steady
            print(
                f"  {side.name} {count} streaming: first piece p50 {_pct(got_stream.first_piece_ms, 0.5):.0f} ms "
                f"p99 {_pct(got_stream.first_piece_ms, 0.99):.0f} ms, relay p50 "
                f"{_pct(got_stream.relay_ms, 0.5):.0f} ms p99 {_pct(got_stream.relay_ms, 0.99):.0f} ms, "
                f"CPU ms per streamed piece all in: web {got_stream.cpu_ms_per_piece:.3f} ({len(side.ports)} web), "
                f"worker {got_stream.worker_cpu_ms_per_piece:.3f}; streaming: web "
                f"{steady.web_ms_per_piece if steady else float('nan'):.3f}, worker "
                f"{steady.worker_ms_per_piece if steady else float('nan'):.3f} (over "
                f"{steady.seconds if steady else 0:.1f} s, {steady.pieces if steady else 0} pieces); "
                f"{got_stream.pieces} pieces, {got_stream.checks} cache checks, errors {got_stream.errors}, "
                f"missing pieces {got_stream.missing_pieces}, {got_stream.seconds:.1f}s",
                flush=True,
            )
            for failure in got_stream.failures[:20]:
                print(f"    failed: {failure}", flush=True)
            if len(got_stream.failures) > 20:
                print(f"    … and {len(got_stream.failures) - 20} more", flush=True)
        if side.features.stop and stops:
            ids = [int(i) for i in side.built["streaming"]]
            figures.stop = got_stop = asyncio.run(measure_stop(side, ids, model_port, stops))
            print(
                f"  {side.name} stop (from web {got_stop.webs[0]}, watched on web {got_stop.webs[1]}): model "
                f"connection closed p50 {_pct(got_stop.closed_ms, 0.5):.0f} ms p95 "
                f"{_pct(got_stop.closed_ms, 0.95):.0f} ms, idle on the other tab p50 "
                f"{_pct(got_stop.idle_ms, 0.5):.0f} ms p95 {_pct(got_stop.idle_ms, 0.95):.0f} ms "
                f"(n={len(got_stop.closed_ms)}/{stops}), errors {len(got_stop.failures)}",
                flush=True,
            )
            for failure in got_stop.failures:
                print(f"    failed: {failure}", flush=True)
    finally:
        side.stop()
        figures.load = (load_before, _load())
        print(f"  {side.name}: load average {figures.load[0]} before, {figures.load[1]} after", flush=True)
    return figures


def _load() -> str:
    """The machine's load average over 1, 5 and 15 minutes."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def _again(values: list[float]) -> float:
    """The median of the loads after the first."""
    return statistics.median(values[1:]) if len(values) > 1 else values[0]


def _ms(value: float) -> str:
    if value != value:  # nan
        return "—"
    if value < 1:
        return f"{value:.2f} ms"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _ratio(old: float, new: float) -> str:
    if old != old or new != new or new <= 0:
        return "—"
    return f"{old / new:.1f}×"


def _socket(got: SocketFigure | None) -> str:
    if got is None:
        return "—"
    if not got.ok:
        return f"failed (close {got.closed})" if got.closed else "failed"
    return f"{got.total / 1e3:,.0f} KB (largest {got.largest / 1e3:,.0f} KB)"


def _size(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 100_000 else f"{size / 1e3:.0f} KB"


def _row(label: str, old: str, new: str, ratio: str = "—") -> None:
    print(f"| {label} | {old} | {new} | {ratio} |")


def report(results: dict[str, SideFigures], sizes: list[int], streams: list[int]) -> None:
    empty = SideFigures()
    old, new = results.get("old", empty), results.get("new", empty)
    nan = float("nan")
    print("\n| measure | old | new | old/new |\n| --- | ---: | ---: | ---: |")
    for size in sizes:
        po, pn = old.pages.get(size), new.pages.get(size)
        _row(
            f"page, {size} turns: time (first, then median)",
            f"{_ms(po.seconds[0] * 1000)}, {_ms(_again(po.seconds) * 1000)}" if po else "—",
            f"{_ms(pn.seconds[0] * 1000)}, {_ms(_again(pn.seconds) * 1000)}" if pn else "—",
            _ratio(_again(po.seconds), _again(pn.seconds)) if po and pn else "—",
        )
        _row(
            f"page, {size} turns: server CPU (first, then median)",
            f"{_ms(po.cpu_seconds[0] * 1000)}, {_ms(_again(po.cpu_seconds) * 1000)}" if po else "—",
            f"{_ms(pn.cpu_seconds[0] * 1000)}, {_ms(_again(pn.cpu_seconds) * 1000)}" if pn else "—",
            _ratio(_again(po.cpu_seconds), _again(pn.cpu_seconds)) if po and pn else "—",
        )
        _row(
            f"page, {size} turns: bytes",
            _size(po.size) if po else "—",
            _size(pn.size) if pn else "—",
            _ratio(po.size, pn.size) if po and pn else "—",
        )
        _row(
            f"page, {size} turns: server memory",
            f"+{po.memory_mb:.0f} MB" if po else "—",
            f"+{pn.memory_mb:.0f} MB" if pn else "—",
        )
    for size in sizes:
        _row(f"reconnect, {size} turns", _socket(old.reconnect.get(size)), _socket(new.reconnect.get(size)))
        _row(f"new tab, {size} turns", _socket(old.cold.get(size)), _socket(new.cold.get(size)))
    for size in sizes:
        bo, bn = old.build_ms.get(size, nan), new.build_ms.get(size, nan)
        _row(f"request build, {size} turns (the next turn's history)", _ms(bo), _ms(bn), _ratio(bo, bn))
    qo, qn = old.queries_per_step, new.queries_per_step
    _row("database queries per step (a ten-step turn)", f"{qo:.1f}", f"{qn:.1f}", _ratio(qo, qn))
    how = "" if old.gap is None or old.gap.via_tab else " (old: through `ask`, its socket fails)"
    for label, q in (("p50", 0.5), ("p95", 0.95)):
        vo = _pct(old.gap.gaps_ms, q) if old.gap else nan
        vn = _pct(new.gap.gaps_ms, q) if new.gap else nan
        _row(f"gap model → next request, {sizes[-1]} turns{how}, {label}", _ms(vo), _ms(vn), _ratio(vo, vn))
    for label, q in (("p50", 0.5), ("p95", 0.95)):
        vo = _pct(old.gap_slow.gaps_ms, q) if old.gap_slow else nan
        vn = _pct(new.gap_slow.gaps_ms, q) if new.gap_slow else nan
        _row(f"gap, tool calls written over about 0.2 s, {label}", _ms(vo), _ms(vn), _ratio(vo, vn))
    _row("of which the read tool's own time, median", _ms(old.read_ms), _ms(new.read_ms))
    for label, q in (("p50", 0.5), ("p95", 0.95)):
        _row(
            f"the read tool with the gap's arguments (100 lines), in-process, {label}",
            _ms(_pct(old.gap_read_ms, q)),
            _ms(_pct(new.gap_read_ms, q)),
        )
    so_ms = _pct(old.gap.start_ms, 0.5) if old.gap and old.gap.start_ms else nan
    sn_ms = _pct(new.gap.start_ms, 0.5) if new.gap and new.gap.start_ms else nan
    _row(f"reply start, {sizes[-1]} turns: send → first request, median", _ms(so_ms), _ms(sn_ms), _ratio(so_ms, sn_ms))
    cpu_old = old.gap.cpu_ms_per_step if old.gap and old.gap.via_tab else nan
    cpu_new = new.gap.cpu_ms_per_step if new.gap else nan
    _row("Daphne CPU per step", _ms(cpu_old), _ms(cpu_new), _ratio(cpu_old, cpu_new))
    wo = old.gap.worker_cpu_ms_per_step if old.gap else nan
    wn = new.gap.worker_cpu_ms_per_step if new.gap else nan
    _row("worker CPU per step (replies in workers; the cache checks included)", _ms(wo), _ms(wn), _ratio(wo, wn))
    _row(
        "cache checks asked during the gaps / model requests",
        f"{old.gap.checks} / {old.gap.requests}" if old.gap else "—",
        f"{new.gap.checks} / {new.gap.requests}" if new.gap else "—",
    )
    for count in streams:
        so, sn = old.streams.get(count), new.streams.get(count)
        fo, fn = so or StreamFigure(count, [], [], nan, 0, 0, 0.0), sn or StreamFigure(count, [], [], nan, 0, 0, 0.0)
        tabs = f", {fn.tabs_per_piece} tabs a piece" if fn.tabs_per_piece > 1 else ""
        steady_o, steady_n = fo.steady or _NO_STEADY, fn.steady or _NO_STEADY
        rows: list[tuple[str, float, float]] = [
            ("first piece p50", _pct(fo.first_piece_ms, 0.5), _pct(fn.first_piece_ms, 0.5)),
            ("first piece p99", _pct(fo.first_piece_ms, 0.99), _pct(fn.first_piece_ms, 0.99)),
            ("relay p50", _pct(fo.relay_ms, 0.5), _pct(fn.relay_ms, 0.5)),
            ("relay p99", _pct(fo.relay_ms, 0.99), _pct(fn.relay_ms, 0.99)),
        ]
        for label, vo, vn in rows:
            _row(f"{count} streaming: {label}", _ms(vo), _ms(vn), _ratio(vo, vn))
        cpu_rows: list[tuple[str, float, float]] = [
            (f"web CPU per streamed piece, all in (all web processes{tabs})", fo.cpu_ms_per_piece, fn.cpu_ms_per_piece),
            ("worker CPU per streamed piece, all in", fo.worker_cpu_ms_per_piece, fn.worker_cpu_ms_per_piece),
            ("web CPU per streamed piece, streaming only", steady_o.web_ms_per_piece, steady_n.web_ms_per_piece),
            (
                "worker CPU per streamed piece, streaming only",
                steady_o.worker_ms_per_piece,
                steady_n.worker_ms_per_piece,
            ),
        ]
        cpu_rows += [
            (
                "web CPU per streamed piece, streaming only, less the idle processes' own",
                steady_o.web_ms_per_piece_beyond_idle,
                steady_n.web_ms_per_piece_beyond_idle,
            ),
            (
                "worker CPU per streamed piece, streaming only, less the idle processes' own",
                steady_o.worker_ms_per_piece_beyond_idle,
                steady_n.worker_ms_per_piece_beyond_idle,
            ),
        ]
        for label, vo, vn in cpu_rows:
            _row(f"{count} streaming: {label}", _cpu(vo), _cpu(vn), _ratio(vo, vn))
        _row(
            f"{count} streaming: streaming-only intervals (seconds, pieces)",
            f"{steady_o.seconds:.1f} s, {steady_o.pieces}" if so else "—",
            f"{steady_n.seconds:.1f} s, {steady_n.pieces}" if sn else "—",
        )
        _row(
            f"{count} streaming: idle CPU, tabs open, web / worker (ms a second)",
            f"{steady_o.idle_web_ms_per_s:.1f} / {steady_o.idle_worker_ms_per_s:.1f}" if so else "—",
            f"{steady_n.idle_web_ms_per_s:.1f} / {steady_n.idle_worker_ms_per_s:.1f}" if sn else "—",
        )
        reply_rows: list[tuple[str, float, float]] = [
            (
                "web CPU per reply beyond its pieces",
                fo.per_reply_ms(fo.cpu_ms_per_piece, steady_o.web_ms_per_piece),
                fn.per_reply_ms(fn.cpu_ms_per_piece, steady_n.web_ms_per_piece),
            ),
            (
                "worker CPU per reply beyond its pieces (start, end, cache check)",
                fo.per_reply_ms(fo.worker_cpu_ms_per_piece, steady_o.worker_ms_per_piece),
                fn.per_reply_ms(fn.worker_cpu_ms_per_piece, steady_n.worker_ms_per_piece),
            ),
        ]
        for label, vo, vn in reply_rows:
            _row(f"{count} streaming: {label}", _ms(vo), _ms(vn), _ratio(vo, vn))
        _row(
            f"{count} streaming: errors (pieces missing)",
            f"{so.errors} ({so.missing_pieces})" if so else "—",
            f"{sn.errors} ({sn.missing_pieces})" if sn else "—",
        )
    stop_o, stop_n = old.stop, new.stop
    if stop_o is not None or stop_n is not None:
        shown = stop_n or stop_o
        assert shown is not None
        where = f"tab on web {shown.webs[0]}, reply watched on web {shown.webs[1]}"
        for label, q in (("p50", 0.5), ("p95", 0.95)):
            vo = _pct(stop_o.closed_ms, q) if stop_o else nan
            vn = _pct(stop_n.closed_ms, q) if stop_n else nan
            _row(f"Stop ({where}) → model connection closed, {label}", _ms(vo), _ms(vn), _ratio(vo, vn))
        for label, q in (("p50", 0.5), ("p95", 0.95)):
            vo = _pct(stop_o.idle_ms, q) if stop_o else nan
            vn = _pct(stop_n.idle_ms, q) if stop_n else nan
            _row(f"Stop ({where}) → idle state on the other tab, {label}", _ms(vo), _ms(vn), _ratio(vo, vn))
        _row(
            "Stop: timed, failed",
            f"{len(stop_o.closed_ms)}, {len(stop_o.failures)}" if stop_o else "—",
            f"{len(stop_n.closed_ms)}, {len(stop_n.failures)}" if stop_n else "—",
        )
    for name, side in (("old", old), ("new", new)):
        if side.load[0]:
            print(f"\n{name}: load average {side.load[0]} before its figures, {side.load[1]} after", end="")
    print(f" ({os.cpu_count()} CPUs)")


_NO_STEADY = Steady(0.0, 0, float("nan"), float("nan"))


def _cpu(value: float) -> str:
    """CPU per piece: three decimals, as the targets are 0.1 and 0.2 ms."""
    return "—" if value != value else f"{value:.3f} ms"


WORKER_MS_PER_PIECE = 0.2  # the targets
WEB_MS_PER_PIECE = 0.1
RELAY_P99_MS = 100.0
GAP_MS = 10.0  # plus the tool's own time, p95


def targets(results: dict[str, SideFigures], sizes: list[int], streams: list[int], workers: int, layer: str) -> None:
    """The issue's targets, for each side: met or missed, with the figure."""
    print(f"\ntargets ({layer} layer, {workers} worker{'s' if workers > 1 else ''}):")

    def verdict(value: float, limit: float) -> str:
        return "—" if value != value else "met" if value <= limit else "MISSED"

    for name, side in results.items():
        print(f"  {name}:")
        for count in streams:
            got = side.streams.get(count)
            if got is None:
                continue
            steady = got.steady or _NO_STEADY
            for what, all_in, only, beyond, limit in (
                (
                    "worker",
                    got.worker_cpu_ms_per_piece,
                    steady.worker_ms_per_piece,
                    steady.worker_ms_per_piece_beyond_idle,
                    WORKER_MS_PER_PIECE,
                ),
                (
                    "web",
                    got.cpu_ms_per_piece,
                    steady.web_ms_per_piece,
                    steady.web_ms_per_piece_beyond_idle,
                    WEB_MS_PER_PIECE,
                ),
            ):
                print(
                    f"    {count} streaming, {what} CPU per streamed piece ≤ {limit} ms: all in {_cpu(all_in)} "
                    f"({verdict(all_in, limit)}), streaming only {_cpu(only)} ({verdict(only, limit)}), less idle "
                    f"{_cpu(beyond)} ({verdict(beyond, limit)})"
                )
            p99 = _pct(got.relay_ms, 0.99)
            ok = verdict(p99, RELAY_P99_MS) if not got.errors else "MISSED"
            print(
                f"    {count} streaming, relay p99 ≤ {RELAY_P99_MS:.0f} ms, no error: {_ms(p99)}, "
                f"{got.errors} errors: {ok}"
            )
        if side.gap is not None:
            tool = _pct(side.gap_read_ms, 0.5) if side.gap_read_ms else side.read_ms
            limit = GAP_MS + tool
            for label, gap in (("answered at once", side.gap), ("written over 0.2 s", side.gap_slow)):
                if gap is None:
                    continue
                p95 = _pct(gap.gaps_ms, 0.95)
                print(
                    f"    gap at {sizes[-1]} turns, calls {label}, p95 ≤ {GAP_MS:.0f} ms + the tool's {_ms(tool)} = "
                    f"{_ms(limit)}: {_ms(p95)} ({verdict(p95, limit)}; {gap.checks} cache checks for "
                    f"{gap.requests} requests)"
                )


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(ROOT))
    from testing.interrupts import sigterm_as_interrupt

    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10 and 100 turns; 1, 10 and 50 sessions streaming")
    parser.add_argument("--sides", default="old,new")
    parser.add_argument("--old", default=OLD_COMMIT, help=f"the old side's commit ({OLD_COMMIT} by default)")
    parser.add_argument(
        "--live",
        action="store_true",
        help="serve the new side from the working tree itself, not from a copy made at the start",
    )
    parser.add_argument("--sizes", help="session sizes in turns, comma-separated (instead of the defaults)")
    parser.add_argument("--streams", help="how many sessions stream at once, comma-separated")
    parser.add_argument("--gap-turns", type=int, help="ten-step turns per gap figure (default 3, 2 with --quick)")
    parser.add_argument(
        "--pieces",
        type=int,
        default=DEFAULT_PIECES,
        help=f"pieces of each streamed reply ({DEFAULT_PIECES}; at most 1,000): with more, a reply's start and end "
        "weigh less in its CPU, and a profile of the streaming figures shows the streaming itself",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample the GIL holder of Daphne (web 0) and of each worker with py-spy into this folder",
    )
    parser.add_argument(
        "--profile-running",
        action="store_true",
        help="with --profile: sample every thread the system shows running, not only the one holding the GIL "
        "(CPU spent without the GIL, in the database driver's C code or in system calls, shows too)",
    )
    parser.add_argument(
        "--layer",
        choices=["postgres", "redis"],
        default="postgres",
        help="both sides' channel layer: postgres (the default) or redis (a database of the machine's Redis "
        "claimed empty for the run)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes of each side (manage.py worker), 1 by default"
    )
    parser.add_argument(
        "--webs",
        type=int,
        default=1,
        help="web (Daphne) processes of each side, 1 by default; with more, each streaming session's measured "
        "tab is on another web process than the tab that sends",
    )
    parser.add_argument("--concurrency", type=int, help="CACHET_WORKER_CONCURRENCY of the workers (16 as deployed)")
    parser.add_argument(
        "--stops",
        type=int,
        default=20,
        help="Stops of a streaming reply timed on each side that can stop one (0: none), 20 by default",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data folders and their logs, and say where")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model-server", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global PIECES
    if not 1 <= args.pieces <= 1000:
        parser.error("--pieces is 1 to 1,000")
    PIECES = args.pieces
    if args.build:
        build(args.build)
        return
    if args.model_server:
        serve_model(args.model_server)
        return
    if args.webs < 1 or args.workers < 1:
        parser.error("--webs and --workers are at least 1")
    global PROFILE_DIR, PROFILE_FLAGS
    PROFILE_DIR = args.profile
    PROFILE_FLAGS = [] if args.profile_running else ["--gil"]
    if PROFILE_DIR is not None:
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    sizes = [10, 100] if args.quick else [10, 100, 1000]
    streams = [1, 10, 50] if args.quick else [1, 10, 50, 100]
    if args.sizes:
        sizes = [int(size) for size in args.sizes.split(",")]
    if args.streams:
        streams = [int(count) for count in args.streams.split(",")]
    gap_turns = args.gap_turns or (2 if args.quick else 3)
    names = [name.strip() for name in args.sides.split(",") if name.strip()]
    base = Path(tempfile.mkdtemp(prefix="cachet-bench-web-"))
    results: dict[str, SideFigures] = {}
    print(
        f"bench/web.py {' '.join(sys.argv[1:] if argv is None else argv)}: {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs, load average {_load()}",
        flush=True,
    )
    try:
        workspace = base / "workspace"
        _write_workspace(workspace)
        with contextlib.ExitStack() as stack:
            model_port = stack.enter_context(_model_server(base))
            model_url = f"http://127.0.0.1:{model_port}/v1"
            trees: dict[str, Path] = {}
            if "new" in names:
                trees["new"] = ROOT if args.live else _new_tree(base)
            if "old" in names:
                trees["old"] = stack.enter_context(_old_tree(base, args.old))
            layer_env: dict[str, str] = {"CACHET_CHANNEL_LAYER": args.layer}
            redis: Any = None
            if args.layer == "redis":
                redis = _claim_redis()
                stack.callback(redis.release)
                layer_env["REDIS_URL"] = redis.url
                print(f"Redis: database {redis.number} of the machine's, claimed for the run", flush=True)
            if args.concurrency:
                layer_env["CACHET_WORKER_CONCURRENCY"] = str(args.concurrency)
            sides = [
                Side(
                    name,
                    trees[name],
                    base / f"{name}-data",
                    model_url,
                    layer_env=_layer_env_for(trees[name], layer_env, name),
                    worker_count=args.workers,
                    web_count=args.webs,
                )
                for name in names
            ]
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(len(sides)) as pool:  # both sides build at once
                list(pool.map(lambda side: side.build(sizes, max(streams), workspace), sides))
            print(
                f"built sessions of {sizes} turns and {max(streams)} more per side in "
                f"{time.monotonic() - started:.0f}s",
                flush=True,
            )
            for side in sides:
                if redis is not None:
                    redis.empty()  # what the side before left (its layer's groups) goes
                results[side.name] = run_side(side, sizes, streams, gap_turns, model_port, args.stops)
        report(results, sizes, streams)
        targets(results, sizes, streams, args.workers, args.layer)
    finally:
        if args.keep:
            print(f"the data folders (Daphne's and the workers' logs) are kept in {base}", flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)


def _layer_env_for(tree: Path, wanted: dict[str, str], name: str) -> dict[str, str]:
    """The channel layer's variables for a side, where its settings know the layer; else its default, said."""
    layer = wanted.get("CACHET_CHANNEL_LAYER", "postgres")
    if layer in Features.probe(tree).layers:
        return dict(wanted)
    print(f"{name}: its settings know no {layer} channel layer; it runs on its default", flush=True)
    return {key: value for key, value in wanted.items() if key not in {"CACHET_CHANNEL_LAYER", "REDIS_URL"}}


def _claim_redis() -> Any:
    """A database of the machine's Redis for the run, claimed as the tests claim theirs (``tests.redis_kit``: the
    claim written in the step that finds it empty, so no test process takes it meanwhile), counted up from 1 where
    the tests count down from the last; emptied before each side and at the end."""
    sys.path.insert(0, str(ROOT))
    import redis as redis_py

    from tests.redis_kit import CLAIM, CLAIM_KEY, CLAIM_SECONDS, REDIS, RedisDatabase

    probe = redis_py.Redis.from_url(REDIS, socket_connect_timeout=2)
    try:
        count = int(probe.config_get("databases").get("databases") or 16)
    except redis_py.exceptions.ConnectionError as error:
        raise SystemExit(f"--layer redis: no Redis answers at {REDIS} ({error})") from error
    finally:
        probe.close()
    token = os.urandom(16).hex()
    for number in range(1, count):
        client = redis_py.Redis.from_url(f"{REDIS}/{number}", socket_connect_timeout=2)
        if client.eval(CLAIM, 1, CLAIM_KEY, token, CLAIM_SECONDS) == 1:
            return RedisDatabase(number, client, token)
        client.close()
    raise SystemExit(f"--layer redis: no database of the Redis at {REDIS} is empty")


if __name__ == "__main__":
    main()
