"""Faults injected into Cachet's team layout mid-reply, and what each costs: lost turns, stuck tabs, dead workers, and
the time the tabs take to recover (issue 37, item 4).

:class:`Layout` starts the layout as deployed (docs/deployment.md, "Web processes and workers"): two web processes
(``manage.py serve --no-worker``, Daphne) and two workers (``manage.py worker``), all on one Postgres reached through
a TCP proxy that can be cut, with the chosen channel layer (``postgres``, or ``redis``), and Redis (the channel layer's,
or Django's cache only on the Postgres layer) through a second proxy that can be cut; a scripted model server
(:mod:`testing.scripted_server`) whose replies stream slowly enough for a fault to land mid-reply; and tabs, websocket
clients that speak to ``/ws/sessions/<id>/`` as ``static/cachet/chat.js`` and htmx's ws extension do. It plays the
supervisor the documented layouts have (systemd ``Restart=on-failure``, compose ``restart:``): a process that exits is
started again (a second after ``kill -9``, at once after a stop that was asked for), and one that exits untold counts as
a dead worker.

Each scenario (:data:`SCENARIOS`) takes a fresh session with two tabs, the one that sends on web ``k % 2`` and one
watching on the other, sends a message, and injects its fault while the reply streams (or, for ``redis-send``, sends
during a Redis outage and just after it):

- ``kill-9``: ``kill -9`` of the worker running the reply (found by the session's reply lock in ``pg_locks``);
- ``sigterm``: SIGTERM of that worker (it lets the reply end, then exits; it is started again);
- ``web-restart``: SIGTERM of the web process the sending tab is on, started again on its port; the tab reconnects as
  the page does (after a close htmx reconnects after, with its full-jitter delay; to the other web process while its
  own is down, as Caddy's ``lb_try_duration`` does) and says hello with the revision it shows;
- ``postgres-outage``: Postgres cut away for ``outage`` seconds mid-reply;
- ``redis-outage``: Redis cut away for ``outage`` seconds mid-reply;
- ``redis-send``: a message sent during a Redis outage, and one just after it.

Then it counts, in an :class:`Outcome`: **lost turns**, messages a tab sent that are neither stored as a turn nor given
back to its box with a notice; **stuck tabs**, tabs that do not show the session idle with every stored turn as stored
within ``settle`` seconds of the fault's end (or whose session does not take the next message at once: a turn of it
does not start within ``next_within`` seconds), and turns left open; **dead workers**, Cachet processes (workers, and
web processes too) that exited without being told. It measures the recovery: from the fault (for an outage, from the
moment the server is back) to the moment every tab shows the turn ended and the session idle.

Used by ``tests/faults/test_faults.py`` (each scenario once per layer) and ``bench/faults.py`` (each N times). The
caller has Django set up on the database the layout is to use (the test database, or the benchmark's own), as the
tabs' login, the sessions and the checks are made through it; the layout's processes reach that database only
through the proxy.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from testing.scripted_server import ScriptedServer, Step
from tests.cachet.proxy_kit import Proxy
from tests.raw_websocket import client_frame

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("postgres", "redis")
RECONNECT_CODES = frozenset({1006, 1011, 1012, 1013})  # htmx's ws extension reconnects after these closes only
PAGE_RECONNECT_AFTER = {1009: 0.5}  # chat.js reconnects itself after these, this many seconds later
STOP_LIMIT = 16.0  # a worker told to stop exits within 15 s (``manage.py worker``'s STOP_LIMIT_SECONDS), and a second
SLOW = "[slow]"  # a message whose reply streams for ``Timing.reply_seconds``
REFUSED_RUNNING = "A reply is running"  # the notice of a send refused because the session is busy
STATE = re.compile(r'data-state="(\w+)"')
TURN = re.compile(r'<article class="turn" id="turn-(\d+)"[^>]*data-status="(\w+)"')
BAR = re.compile(r'id="bar-(\d+)"')
TEXTAREA = re.compile(r"<textarea[^>]*>(.*?)</textarea>", re.S)
NOTICE = re.compile(r'<span class="notice-text">(.*?)</span>', re.S)


@dataclass(frozen=True)
class Timing:
    """How long things take in a run: the slow reply (``pieces`` words, one every ``piece_delay`` seconds), when a
    fault lands in it, how long an outage lasts, and the bounds after which a tab counts as stuck."""

    pieces: int = 50
    piece_delay: float = 0.05
    fault_after: int = 24  # pieces the tab has seen when the fault is injected (a draft is saved every second)
    outage: float = 2.5
    settle: float = 10.0  # after the fault is over, every tab shows the session idle and its turns as stored
    next_within: float = 5.0  # a message sent once the tab shows idle starts within this
    start: float = 90.0  # a process of the layout gets ready within this

    @property
    def reply_seconds(self) -> float:
        return self.pieces * self.piece_delay


@dataclass
class Outcome:
    """What one run of a scenario cost."""

    scenario: str
    layer: str
    lost: int = 0
    stuck: int = 0
    dead: int = 0
    recovery: float | None = None  # seconds from the fault (an outage: its end) to every tab settled
    next_start: float | None = None  # seconds from the next message to its turn shown started
    notes: list[str] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # what happened, seconds from the run's start
    started: float = field(default_factory=time.monotonic)

    def mark(self, what: str, at: float | None = None) -> None:
        self.timeline.append(((time.monotonic() if at is None else at) - self.started, what))

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.stuck == 0 and self.dead == 0

    def said(self) -> str:
        recovery = f"{self.recovery:.2f} s" if self.recovery is not None else "none"
        head = (
            f"{self.scenario} on {self.layer}: lost turns {self.lost}, stuck tabs {self.stuck}, "
            f"dead workers {self.dead}, recovery {recovery}"
        )
        return head + "".join(f"\n  - {note}" for note in self.notes)

    def story(self) -> str:
        """The run's timeline, one line per moment."""
        return "\n".join(f"  {at:7.2f} s  {what}" for at, what in sorted(self.timeline))


# --- the model ---------------------------------------------------------------------------------------------------


class ScriptedModel(ScriptedServer):
    """The scripted server answering by the last user message: a slow reply to one holding :data:`SLOW` (words
    named after the message, one per piece), else a short one at once."""

    def __init__(self, timing: Timing) -> None:
        super().__init__(model="scripted")
        self.timing = timing
        self._local = threading.local()

    def _record(self, body: bytes) -> int:
        number = super()._record(body)
        self._local.step = self._step_for(body)
        return number

    def _next_step(self) -> Step:
        step: Step = getattr(self._local, "step", None) or Step(text="?")
        return step

    def _step_for(self, body: bytes) -> Step:
        try:
            messages = json.loads(body)["messages"]
            said = next(json.dumps(m.get("content")) for m in reversed(messages) if m.get("role") == "user")
        except (ValueError, KeyError, TypeError, StopIteration):
            return Step(text="?")
        marker = re.search(r"\bm[0-9a-f]{8}\b", said)
        name = marker.group(0) if marker else "m"
        if SLOW in said:
            words = "".join(f"{name}w{k:03d} " for k in range(self.timing.pieces))
            return Step(text=words, chunk_size=len(name) + 5, delay=self.timing.piece_delay)
        return Step(text=f"Done with {name}.")


# --- the processes -----------------------------------------------------------------------------------------------


@dataclass
class Member:
    """One process of the layout (a web process or a worker), started again by the supervisor when it exits."""

    name: str
    kind: str  # "web" or "worker"
    command: list[str]
    env: dict[str, str]
    logs: Path
    port: int = 0
    popen: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    starts: int = 0
    told: bool = False  # the harness signalled it: its exit is no death
    restart_after: float = 1.0
    exited_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    exits: list[tuple[float, int]] = field(default_factory=list)  # when it exited, and its code: every exit
    signalled_at: float | None = None  # the harness's last signal to it (kept when it starts again)

    def start(self) -> None:
        self.starts += 1
        self.log = self.logs / f"{self.name}.{self.starts}.log"
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, *self.command],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.told = False
        self.exited_at = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log is not None and self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def ready(self) -> bool:
        if not self.alive():
            return False
        if self.kind == "worker":
            return "Worker ready" in self.output()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return "Listening on TCP address" in self.output()
        return False

    def signal(self, sig: signal.Signals, *, restart_after: float) -> None:
        """Send ``sig`` to the process (told: its exit is no death); the supervisor starts it again
        ``restart_after`` seconds after it exits."""
        assert self.popen is not None
        self.told = True
        self.restart_after = restart_after
        self.signalled_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        """Stop it for good (SIGTERM, then SIGKILL after 30 s), its process group too."""
        if self.popen is None:
            return
        self.told = True
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


class Supervisor:
    """Starts the layout's processes again when they exit, as systemd's ``Restart=on-failure`` or compose's
    ``restart:`` does; counts the ones that exited untold."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.dead = 0
        self.deaths: list[str] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="faults-supervisor", daemon=True)

    def start(self) -> None:
        for member in self.members:
            member.start()
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.wait(0.05):
            now = time.monotonic()
            for member in self.members:
                with self._lock:
                    if self._stopping.is_set() or member.popen is None:
                        continue
                    code = member.popen.poll()
                    if code is None:
                        continue
                    if member.exited_at is None:
                        member.exited_at = now
                        member.exit_codes.append(code)
                        member.exits.append((now, code))
                        if not member.told:
                            self.dead += 1
                            self.deaths.append(f"{member.name} exited untold (exit {code}); see {member.log}")
                            member.restart_after = 1.0
                    if now - member.exited_at >= member.restart_after:
                        member.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
        self._thread.join(timeout=5)
        for member in self.members:
            member.stop()


# --- the tabs ----------------------------------------------------------------------------------------------------


class Tab:
    """A chat page's websocket, as chat.js and htmx's ws extension use it: it says hello with what it shows when its
    socket opens, applies the ops it is sent (the controls' state, the turns and their status, words given back to
    the box, notices), asks for the live text when it sees a gap, and reconnects after the closes htmx reconnects
    after, with htmx's full-jitter delay (to another web process while its own is down, as Caddy does). Runs on the
    layout's event loop; its state is read from other threads."""

    def __init__(self, name: str, path: str, cookie: str, ports: list[int], home: int) -> None:
        self.name = name
        self.path = path
        self.cookie = cookie
        self.ports = ports
        self.home = home
        self.rev = 0
        self.bar = 0
        self.controls = ""
        self.controls_at = 0.0
        self.turns: dict[int, tuple[str, float]] = {}  # turn number: its data-status as shown, and since when
        self.composer: list[str] = []  # words given back to the box
        self.notices: list[tuple[float, str]] = []
        self.opens: list[tuple[float, int]] = []  # when a socket opened, on which port
        self.closes: list[tuple[float, int]] = []  # when a socket closed, and its code
        self.gave_up: int | None = None  # the close after which the page does not reconnect
        self.streamed = 0  # characters of live text seen, all steps
        self._live: dict[int, tuple[int, int]] = {}  # turn: (step, characters shown)
        self._live_asked = 0.0
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._retries = 0
        self.history: list[tuple[float, str]] = []  # what the tab showed and when, for a run's timeline

    @property
    def connected(self) -> bool:
        return self._writer is not None

    @property
    def first(self) -> int:
        return min(self.turns, default=0)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"tab {self.name}")

    async def close(self) -> None:
        self._closing = True
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def send(self, data: Mapping[str, Any]) -> bool:
        """Send ``data`` now; False where the socket is not open (the page then waits, or keeps the words)."""
        if self._writer is None or self._writer.is_closing():
            return False
        self._writer.write(client_frame(json.dumps(data).encode()))
        return True

    async def _run(self) -> None:
        while not self._closing:
            code = await self._connect_once()
            self.closes.append((time.monotonic(), code))
            self.history.append((time.monotonic(), f"socket closed ({code})"))
            if self._closing:
                return
            if code in PAGE_RECONNECT_AFTER:
                await asyncio.sleep(PAGE_RECONNECT_AFTER[code])
                continue
            if code not in RECONNECT_CODES:
                self.gave_up = code
                return
            delay = random.random() * 2 ** min(self._retries, 6)  # htmx: full jitter, 1 s doubling, 64 s at most
            self._retries += 1
            await asyncio.sleep(delay)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """A connection to the tab's web process, else to another one (Caddy's ``lb_try_duration``)."""
        order = [self.home, *(port for port in self.ports if port != self.home)]
        error: OSError | None = None
        for port in order:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port, limit=2**24), timeout=5
                )
            except (OSError, TimeoutError) as failed:
                error = failed if isinstance(failed, OSError) else OSError(str(failed))
                continue
            return reader, writer, port
        raise error or OSError("no web process")

    async def _connect_once(self) -> int:
        try:
            reader, writer, port = await self._open()
        except OSError:
            return 1006
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
                f"Cookie: {self.cookie}\r\n\r\n"
            ).encode()
        )
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=60)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return 1006
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            return 1006
        self._writer = writer
        self._retries = 0
        self.opens.append((time.monotonic(), port))
        self.history.append((time.monotonic(), f"socket open on :{port}, hello rev {self.rev}"))
        self.send({"type": "hello", "rev": self.rev, "first": self.first, "bar": self.bar})
        try:
            return await self._read(reader, writer)
        finally:
            self._writer = None
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        parts: list[bytes] = []
        try:
            while True:
                first, second = await reader.readexactly(2)
                length = second & 0x7F
                if length == 126:
                    length = int.from_bytes(await reader.readexactly(2), "big")
                elif length == 127:
                    length = int.from_bytes(await reader.readexactly(8), "big")
                payload = await reader.readexactly(length)
                opcode = first & 0x0F
                if opcode == 0x8:
                    return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                if opcode == 0x9:
                    writer.write(bytes([0x8A, 0x80]) + b"\0\0\0\0")
                    continue
                if opcode in (0x0, 0x1, 0x2):
                    parts.append(payload)
                    if first & 0x80:
                        self._apply(json.loads(b"".join(parts)))
                        parts = []
        except (OSError, asyncio.IncompleteReadError):
            return 1006

    def _apply(self, message: Mapping[str, Any]) -> None:
        now = time.monotonic()
        for op in message.get("ops", []):
            name, markup = str(op.get("id", "")), str(op.get("html", ""))
            if op.get("op") == "put":
                for number in BAR.findall(markup):
                    self.bar = max(self.bar, int(number))
                if name == "controls" and (state := STATE.search(markup)):
                    if state.group(1) != self.controls:
                        self.history.append((now, f"controls {state.group(1)}"))
                    self.controls, self.controls_at = state.group(1), now
                elif name.startswith("turn-") or name == "transcript":
                    if name == "transcript":
                        self.turns = {}
                    for number, status in TURN.findall(markup):
                        if self.turns.get(int(number), ("", 0.0))[0] != status:
                            self.history.append((now, f"turn {number} {status}"))
                        self.turns[int(number)] = (status, now)
                elif name == "composer-text" and (box := TEXTAREA.search(markup)):
                    self.composer.append(html.unescape(box.group(1)))
                    self.history.append((now, f"words back: {self.composer[-1]!r}"))
                elif name == "notice" and (notice := NOTICE.search(markup)):
                    self.notices.append((now, html.unescape(notice.group(1))))
                    self.history.append((now, f"notice: {self.notices[-1][1]}"))
            elif op.get("op") == "remove" and name.startswith("turn-"):
                self.turns.pop(int(name.removeprefix("turn-")), None)
            elif op.get("op") == "append" and name == "composer-text" and self.composer:
                self.composer[-1] += str(op.get("text", ""))
        live = message.get("live")
        if isinstance(live, dict):
            self._apply_live(live, now)
        if isinstance(message.get("rev"), int):
            self.rev = max(self.rev, int(message["rev"]))
        if message.get("hello"):  # as chat.js: the server's channel layer was away, the tab says what it shows
            self.history.append((now, f"asked to say hello again: hello rev {self.rev}"))
            self.send({"type": "hello", "rev": self.rev, "first": self.first, "bar": self.bar})

    def _apply_live(self, live: Mapping[str, Any], now: float) -> None:
        """As chat.js's applyLive: a newer step (or a reset) starts the text again; a piece past what the tab has
        asks for the live text (at most every 2 s)."""
        turn, step = int(live.get("turn", 0)), int(live.get("step", 0))
        shown_step, have = self._live.get(turn, (0, 0))
        if step < shown_step:
            return
        if step > shown_step or live.get("reset"):
            shown_step, have = step, 0
        text = str(live.get("text", ""))
        at = int(live.get("text_at", 0))
        if text and at > have:
            if now - self._live_asked >= 2.0:
                self._live_asked = now
                self.send({"type": "live"})
        elif text and at + len(text) > have:
            self.streamed += at + len(text) - have
            have = at + len(text)
        self._live[turn] = (shown_step, have)

    def given_back(self, words: str) -> bool:
        """Whether ``words`` came back to the box, with a notice saying why."""
        return any(words.strip() == back.strip() for back in self.composer) and any(text for _, text in self.notices)


class TabLoop:
    """An event loop in a thread of its own, where the tabs run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="faults-tabs", daemon=True)
        self._thread.start()

    def call(self, function: Callable[[], Any]) -> Any:
        """Run ``function`` on the loop and return what it returned."""

        async def wrapped() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout=30)

    def wait(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


# --- the layout --------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _database_through(proxy: Proxy, params: Mapping[str, Any], *, application: str) -> str:
    user = quote(str(params.get("user") or ""), safe="")
    password = quote(str(params.get("password") or ""), safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    name = quote(str(params["dbname"]), safe="")
    return f"postgresql://{credentials}127.0.0.1:{proxy.port}/{name}?application_name={quote(application)}"


def _postgres_target(params: Mapping[str, Any]) -> tuple[str, int] | str:
    host, port = str(params.get("host") or "/var/run/postgresql"), int(params.get("port") or 5432)
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


def _mended(proxy: Proxy | None) -> None:
    """``proxy`` forwarding again, where it was cut."""
    if proxy is not None and proxy._listener is None:
        proxy.mend()


def _redis_target(url: str) -> tuple[tuple[str, int], str]:
    """Redis's address and the database part of ``url`` (``/3``)."""
    address = urlsplit(url)
    return (address.hostname or "127.0.0.1", address.port or 6379), address.path or "/0"


class Layout:
    """Cachet's team layout on one channel layer, with proxies to cut Postgres and Redis away, a scripted model, and
    tabs; use it as a context manager. ``redis_url`` names a Redis database the layout may use (and empty): the
    channel layer's on ``redis``, Django's cache on ``postgres``; without it, the Postgres layer runs without Redis
    and the Redis scenarios cut nothing."""

    def __init__(
        self,
        layer: str,
        *,
        base: Path,
        redis_url: str | None = None,
        timing: Timing | None = None,
        concurrency: int = 4,
    ) -> None:
        if layer not in LAYERS:
            raise ValueError(f"the layer is one of {', '.join(LAYERS)}, not {layer!r}")
        if layer == "redis" and not redis_url:
            raise ValueError("the Redis layer needs a Redis database (redis_url)")
        self.layer = layer
        self.base = base
        self.redis_url = redis_url
        self.timing = timing or Timing()
        self.concurrency = concurrency
        self.logs = base / "logs"
        self.data = base / "data"
        self.model = ScriptedModel(self.timing)
        self.postgres: Proxy | None = None
        self.redis: Proxy | None = None
        self.webs: list[Member] = []
        self.workers: list[Member] = []
        self.supervisor: Supervisor | None = None
        self.tabs = TabLoop()
        self.cookie = ""
        self.runs = 0
        self._open_tabs: list[Tab] = []
        self._user: Any = None
        self._workspace: Any = None
        self._endpoint: Any = None

    # Starting and stopping.

    def __enter__(self) -> Layout:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        from django.db import connection

        self.logs.mkdir(parents=True, exist_ok=True)
        self.model.start()
        params = connection.get_connection_params()
        self.postgres = Proxy(_postgres_target(params))
        redis_env: dict[str, str] = {}
        if self.redis_url:
            address, database = _redis_target(self.redis_url)
            self.redis = Proxy(address)
            redis_env["REDIS_URL"] = f"redis://127.0.0.1:{self.redis.port}{database}"
        self.prepare()
        ports = [_free_port(), _free_port()]
        for number, port in enumerate(ports):
            env = self._env(_database_through(self.postgres, params, application=f"faults-web-{number}"), redis_env)
            command = ["manage.py", "serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port)]
            self.webs.append(Member(f"web-{number}", "web", command, env, self.logs, port=port, restart_after=0.0))
        for number in range(2):
            env = self._env(_database_through(self.postgres, params, application=f"faults-worker-{number}"), redis_env)
            self.workers.append(Member(f"worker-{number}", "worker", ["manage.py", "worker"], env, self.logs))
        self.supervisor = Supervisor([*self.webs, *self.workers])
        self.supervisor.start()
        self.wait_ready()

    def _env(self, database_url: str, extra: Mapping[str, str]) -> dict[str, str]:
        from django.conf import settings

        dropped = {"DATABASE_URL", "REDIS_URL", "CACHET_DATA", "SECRET_KEY", "DEBUG", "PYTEST_CURRENT_TEST"}
        env = {key: value for key, value in os.environ.items() if key not in dropped}
        env.update(
            DATABASE_URL=database_url,
            CACHET_DATA=str(self.data),
            CACHET_WORKSPACE_ROOTS=str(self.data / "workspaces"),
            CACHET_CHANNEL_LAYER=self.layer,
            CACHET_MODEL_URL=self.model.base_url,
            CACHET_MODEL="scripted",
            CACHET_WORKER_CONCURRENCY=str(self.concurrency),
            SECRET_KEY=str(settings.SECRET_KEY),  # the tabs' login is made here: the same key signs it
            ALLOWED_HOSTS="127.0.0.1",
            DJANGO_SETTINGS_MODULE="cachet.settings",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            PYTHONUNBUFFERED="1",
            LOG_LEVEL="INFO",  # Daphne's "Listening on TCP address" line says a web process is up
            **extra,
        )
        return env

    def prepare(self) -> None:
        """The person the tabs are logged in as, their workspace and the scripted model's endpoint: made when the
        layout starts, and again by a test whose database was emptied since."""
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.test import Client

        from cachet.cookies import cookie_names
        from sessions_app.models import ModelEndpoint, Workspace

        tag = secrets.token_hex(4)
        folder = self.data / "workspaces" / f"faults-{tag}"  # a folder is one workspace's: each prepare has its own
        folder.mkdir(parents=True)
        self._user = get_user_model().objects.create_user(username=f"faults-{tag}", password=None)
        self._workspace = Workspace.objects.create(name=f"faults-{tag}", folder=str(folder), allow_commands=False)
        self._workspace.members.add(self._user)
        self._endpoint = ModelEndpoint.objects.create(
            name=f"faults-{tag}", base_url=self.model.base_url, model="scripted", context_window=100_000
        )
        client = Client()
        client.force_login(self._user)
        key = client.cookies[settings.SESSION_COOKIE_NAME].value
        # the layout's processes are given this process's SECRET_KEY, and name their cookies after it
        self.cookie = f"{cookie_names(str(settings.SECRET_KEY), tls=False).session}={key}"

    def wait_ready(self, timeout: float | None = None, *, workers: int | None = None) -> None:
        """Until every web process of the layout is up and ``workers`` of its workers (all by default), one started
        again included."""
        deadline = time.monotonic() + (timeout or self.timing.start)
        wanted = len(self.workers) if workers is None else workers
        while not (all(web.ready() for web in self.webs) and sum(worker.ready() for worker in self.workers) >= wanted):
            if time.monotonic() > deadline:
                late = [member for member in [*self.webs, *self.workers] if not member.ready()]
                raise RuntimeError("not ready: " + "; ".join(f"{m.name}:\n{m.output()[-3000:]}" for m in late))
            time.sleep(0.05)

    def close(self) -> None:
        for tab in self._open_tabs:
            with contextlib.suppress(Exception):
                self.tabs.wait(tab.close())
        self._open_tabs = []
        for proxy in (self.postgres, self.redis):
            _mended(proxy)
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        for proxy in (self.postgres, self.redis):
            if proxy is not None:
                proxy.close()
        self.tabs.close()
        self.model.close()

    # What scenarios use.

    @property
    def dead(self) -> int:
        return self.supervisor.dead if self.supervisor is not None else 0

    def session(self) -> Any:
        from chat.tools import tool_list
        from sessions_app.services.sessions import session_start

        return session_start(
            owner=self._user,
            workspace=self._workspace,
            endpoint=self._endpoint,
            model_name="scripted",
            tools=tool_list(allow_commands=False),
        )

    def tab(self, name: str, session_id: int, web: int) -> Tab:
        tab = Tab(
            name, f"/ws/sessions/{session_id}/", self.cookie, [web.port for web in self.webs], self.webs[web].port
        )
        self.tabs.call(tab.start)
        self._open_tabs.append(tab)
        return tab

    def close_tab(self, tab: Tab) -> None:
        self.tabs.wait(tab.close())
        if tab in self._open_tabs:
            self._open_tabs.remove(tab)

    def reply_worker(self, session_id: int, timeout: float = 10.0) -> Member:
        """The worker holding the session's reply lock (the one running its reply)."""
        from django.db import connection

        from sessions_app.services.locks import LOCK_NAMESPACE

        deadline = time.monotonic() + timeout
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objsubid = 2"
                    " AND l.objid = %s"
                    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                    [LOCK_NAMESPACE, session_id],
                )
                names = [str(row[0]) for row in cursor.fetchall()]
            for worker in self.workers:
                if f"faults-{worker.name}" in names:
                    return worker
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker holds session {session_id}'s reply lock (holders: {names})")
            time.sleep(0.02)

    def outputs(self) -> str:
        """Every process's log of this layout (every start), for a failure's report."""
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"===== {log.name} =====\n{log.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts)


# --- the scenarios -----------------------------------------------------------------------------------------------


def _stored(session_id: int) -> dict[int, str]:
    from sessions_app.models import Turn, TurnStatus

    rows = Turn.objects.filter(session_id=session_id).exclude(status=TurnStatus.TAKEN_BACK)
    return dict(rows.values_list("number", "status"))


def _turn_of(session_id: int, words: str) -> Any:
    from sessions_app.models import Turn

    return Turn.objects.filter(session_id=session_id, words=words).order_by("-number").first()


def _open_turns(session_id: int) -> int:
    from sessions_app.models import Turn, TurnStatus

    return Turn.objects.filter(session_id=session_id, status=TurnStatus.OPEN).count()


@dataclass
class Run:
    """One run of a scenario: its session, its two tabs, the messages sent and what was found."""

    layout: Layout
    outcome: Outcome
    session_id: int
    sender: Tab
    watcher: Tab
    dead_before: int
    sent: list[str] = field(default_factory=list)

    @property
    def tabs(self) -> list[Tab]:
        return [self.sender, self.watcher]

    def words(self, *, slow: bool) -> str:
        marker = f"m{secrets.token_hex(4)}"
        return f"Tell me {'slowly' if slow else 'briefly'} {marker} {SLOW if slow else ''}".strip()

    def say(self, tab: Tab, words: str) -> bool:
        """Send ``words`` from ``tab`` as the page's Send does; False where its socket is not open."""
        sent: bool = self.layout.tabs.call(lambda: tab.send({"type": "send", "text": words}))
        if sent:
            self.sent.append(words)
            self.outcome.mark(f"{tab.name} sends {words!r}")
        else:
            self.outcome.notes.append(f"{tab.name} could not send {words!r}: its socket is not open")
        return sent

    def until(self, check: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def streaming(self) -> None:
        """Until the sending tab has seen ``fault_after`` pieces of the reply."""
        timing = self.layout.timing
        piece = len("m00000000w000 ")
        if not self.until(lambda: self.sender.streamed >= timing.fault_after * piece, 30):
            raise RuntimeError(
                f"the reply did not stream to {self.sender.name}\n{self.outcome.story()}\n{self.layout.outputs()}"
            )
        self.outcome.mark(f"{self.sender.name} has seen {self.sender.streamed // piece} pieces")

    def _shows_stored(self, tab: Tab, stored: Mapping[int, str]) -> bool:
        shown = {number: status for number, (status, _) in tab.turns.items()}
        return tab.controls == "idle" and shown == dict(stored) and tab.connected

    def settle(self, reference: float) -> None:
        """Until every tab shows the session idle and each stored turn as stored, none of them open: the recovery
        is timed from ``reference``; past ``settle`` seconds a tab that does not is stuck."""
        deadline = time.monotonic() + self.layout.timing.settle
        while True:
            stored = _stored(self.session_id)
            waiting = [tab for tab in self.tabs if not self._shows_stored(tab, stored)]
            if not waiting and "open" not in stored.values() and not self._unanswered():
                break
            if time.monotonic() > deadline:
                for tab in waiting:
                    self.outcome.stuck += 1
                    shown = {number: status for number, (status, _) in tab.turns.items()}
                    self.outcome.notes.append(
                        f"{tab.name} stuck: controls {tab.controls or 'none'}, shows turns {shown}, stored {stored}, "
                        f"{'connected' if tab.connected else f'disconnected (closes {tab.closes})'}"
                    )
                if "open" in stored.values():
                    self.outcome.notes.append(f"a turn is still open {self.layout.timing.settle:g} s after: {stored}")
                for words in self._unanswered():
                    self.outcome.notes.append(
                        f"{words!r} is neither a turn nor given back {self.layout.timing.settle:g} s after"
                    )
                return
            time.sleep(0.02)
        moments = [tab.controls_at for tab in self.tabs]
        moments += [when for tab in self.tabs for number, (_, when) in tab.turns.items() if number in stored]
        if self.outcome.recovery is None:
            self.outcome.recovery = max(0.0, max(moments) - reference)
        self.outcome.mark(f"every tab settled: {stored}", max(moments))

    def _unanswered(self) -> list[str]:
        """The messages sent that are neither stored as a turn nor given back yet."""
        return [
            words
            for words in self.sent
            if _turn_of(self.session_id, words) is None and not any(tab.given_back(words) for tab in self.tabs)
        ]

    def next_message(self) -> None:
        """The session takes the next message at once: sent once the tab shows it idle, its turn starts within
        ``next_within`` seconds and ends, every tab showing it."""
        if self.outcome.stuck:
            return
        words = self.words(slow=False)
        before = len(self.sender.notices)
        sent_at = time.monotonic()
        if not self.say(self.sender, words):
            self.outcome.stuck += 1
            return
        started = self.until(lambda: _turn_of(self.session_id, words) is not None, self.layout.timing.next_within)
        if not started:
            self.outcome.stuck += 1
            refused = [text for _, text in self.sender.notices[before:] if text]
            self.outcome.notes.append(
                f"the session did not take the next message within {self.layout.timing.next_within:g} s"
                + (f" (told: {refused})" if refused else "")
            )
            return
        self.outcome.next_start = time.monotonic() - sent_at
        self.settle(time.monotonic())

    def finish(self) -> Outcome:
        from sessions_app.models import TurnStatus

        for words in self.sent:
            turn = _turn_of(self.session_id, words)
            if turn is None and not any(tab.given_back(words) for tab in self.tabs):
                self.outcome.lost += 1
                self.outcome.notes.append(f"lost: {words!r} is neither stored nor given back")
            elif turn is not None and turn.status == TurnStatus.INTERRUPTED and not turn.reply_text:
                self.outcome.notes.append(f"turn {turn.number} was marked interrupted without the text it streamed")
        still_open = _open_turns(self.session_id)
        if still_open and not any(note.startswith("a turn is still open") for note in self.outcome.notes):
            self.outcome.stuck += still_open
            self.outcome.notes.append(f"{still_open} turn(s) left open")
        self.outcome.dead = self.layout.dead - self.dead_before
        if self.layout.supervisor is not None:
            self.outcome.notes.extend(self.layout.supervisor.deaths[self.dead_before :])
        for tab in self.tabs:
            for at, what in tab.history:
                self.outcome.mark(f"{tab.name}: {what}", at)
            if tab.gave_up is not None:
                self.outcome.notes.append(f"{tab.name}'s socket closed with {tab.gave_up}: the page does not reconnect")
            self.layout.close_tab(tab)
        return self.outcome


def _begin(layout: Layout, scenario: str) -> Run:
    """A fresh session with its two tabs, both showing it idle, on a layout that is all up."""
    for proxy in (layout.postgres, layout.redis):
        _mended(proxy)
    # Both workers up, as a team's layout runs: the fault stops one, and the other takes the next message. A worker
    # the last fault stopped may still be starting (4 s and more on a loaded machine); a run begun without it left
    # the next message queued with no worker to take it until the stopped one was back.
    layout.wait_ready()
    session = layout.session()
    home = layout.runs % 2
    layout.runs += 1
    sender = layout.tab(f"tab-on-web-{home}", session.pk, home)
    watcher = layout.tab(f"tab-on-web-{1 - home}", session.pk, 1 - home)
    run = Run(layout, Outcome(scenario, layout.layer), session.pk, sender, watcher, layout.dead)
    run.outcome.mark(f"session {session.pk}: {sender.name} sends, {watcher.name} watches")
    if not run.until(lambda: all(tab.connected and tab.controls == "idle" for tab in run.tabs), 30):
        raise RuntimeError(f"the tabs of session {session.pk} did not show it idle\n{layout.outputs()}")
    return run


def _mid_reply(layout: Layout, scenario: str, inject: Callable[[Run], float]) -> Outcome:
    run = _begin(layout, scenario)
    run.say(run.sender, run.words(slow=True))
    run.streaming()
    reference = inject(run)
    run.outcome.mark("the fault is over" if scenario.endswith("outage") else "the fault", reference)
    run.settle(reference)
    run.next_message()
    return run.finish()


def _others(run: Run, worker: Member) -> str:
    others = [other for other in run.layout.workers if other is not worker]
    said = [f"{other.name} {'ready' if other.ready() else 'not ready'}" for other in others]
    return ", ".join(said) or "no other worker"


def _kill(run: Run) -> float:
    worker = run.layout.reply_worker(run.session_id)
    at = time.monotonic()
    worker.signal(signal.SIGKILL, restart_after=1.0)  # Restart=on-failure: a kill -9 is a failure
    run.outcome.mark(f"kill -9 {worker.name}, the worker running the reply ({_others(run, worker)})", at)
    return at


def _terminate(run: Run) -> float:
    worker = run.layout.reply_worker(run.session_id)
    at = time.monotonic()
    worker.signal(signal.SIGTERM, restart_after=0.0)  # stopped as asked, then started again by its operator
    run.outcome.mark(f"SIGTERM to {worker.name}, the worker running the reply ({_others(run, worker)})", at)
    return at


def _web_restart(run: Run) -> float:
    web = next(web for web in run.layout.webs if web.port == run.sender.home)
    at = time.monotonic()
    web.signal(signal.SIGTERM, restart_after=0.0)  # systemctl restart: stopped, then started again on its port
    run.outcome.mark(f"SIGTERM to {web.name}, the web process of {run.sender.name} (started again once it exits)", at)
    return at


def _outage(run: Run, proxy: Proxy | None, what: str) -> float:
    """``what`` cut away for the timing's outage; the moment it is back."""
    seconds = run.layout.timing.outage
    if proxy is None:
        run.outcome.notes.append(f"no {what} in this layout: nothing to cut")
        return time.monotonic()
    proxy.cut()
    run.outcome.mark(f"{what} cut away")
    try:
        time.sleep(seconds)
    finally:
        proxy.mend()
    return time.monotonic()


def kill_9(layout: Layout) -> Outcome:
    return _mid_reply(layout, "kill-9", _kill)


def sigterm(layout: Layout) -> Outcome:
    """SIGTERM to the worker running the reply: the reply ends, the worker exits within ``STOP_LIMIT`` seconds
    (``manage.py worker``'s 15 s) and is started again."""
    began = time.monotonic()
    outcome = _mid_reply(layout, "sigterm", _terminate)
    for worker in layout.workers:
        signalled = worker.signalled_at
        if signalled is None or signalled < began:
            continue
        # the supervisor may have started it again already: its exits are kept, whatever it does next
        deadline = signalled + STOP_LIMIT
        while not (after := [exit for exit in worker.exits if exit[0] >= signalled]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not after:
            outcome.stuck += 1
            outcome.notes.append(f"{worker.name} had not exited {STOP_LIMIT:g} s after SIGTERM")
        else:
            exited, code = after[0]
            outcome.mark(f"{worker.name} exited ({code})", exited)
            if code != 0:
                outcome.notes.append(f"{worker.name} exited with {code} after SIGTERM")
    return outcome


def web_restart(layout: Layout) -> Outcome:
    return _mid_reply(layout, "web-restart", _web_restart)


def postgres_outage(layout: Layout) -> Outcome:
    return _mid_reply(layout, "postgres-outage", lambda run: _outage(run, layout.postgres, "Postgres"))


def redis_outage(layout: Layout) -> Outcome:
    return _mid_reply(layout, "redis-outage", lambda run: _outage(run, layout.redis, "Redis"))


def redis_send(layout: Layout) -> Outcome:
    """A message sent during a Redis outage, and one just after it (by the first tab that shows the session idle,
    as the page sends only then)."""
    run = _begin(layout, "redis-send")
    outage = layout.timing.outage
    if layout.redis is not None:
        layout.redis.cut()
        run.outcome.mark("Redis cut away")
    try:
        time.sleep(min(0.5, outage / 4))
        run.say(run.sender, run.words(slow=False))
        time.sleep(outage - min(0.5, outage / 4))
    finally:
        if layout.redis is not None:
            layout.redis.mend()
    back = time.monotonic()
    run.outcome.mark("Redis is back", back)
    if run.until(lambda: any(tab.connected and tab.controls == "idle" for tab in run.tabs), 1.0):
        tab = next(tab for tab in run.tabs if tab.connected and tab.controls == "idle")
        run.say(tab, run.words(slow=False))
    else:
        run.outcome.notes.append("no tab showed the session idle within 1 s of Redis's return to send from")
    run.settle(back)
    run.next_message()
    return run.finish()


SCENARIOS: dict[str, Callable[[Layout], Outcome]] = {
    "kill-9": kill_9,
    "sigterm": sigterm,
    "web-restart": web_restart,
    "postgres-outage": postgres_outage,
    "redis-outage": redis_outage,
    "redis-send": redis_send,
}


@contextlib.contextmanager
def layout(layer: str, *, base: Path, redis_url: str | None, timing: Timing | None = None) -> Iterator[Layout]:
    """A :class:`Layout` for the block."""
    with Layout(layer, base=base, redis_url=redis_url, timing=timing) as made:
        yield made
