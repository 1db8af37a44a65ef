"""``run``: a shell command in a sandbox holding the workspace (see ``sandbox``), its output read from a pipe
as it comes. Nothing of it is written outside the sandbox: the output is kept in memory up to the sandbox's
``output_max_bytes``; past that its first and last halves are kept, with a line saying what was cut between.

The call ends when the command exits, its time is up, the person stops the reply (``cancelled``), or the
workspace passes its disk quota while it runs; in the last three cases everything it started is killed.

While it runs, and once more when it ends, the workspace is walked again (``_Watch``): for its quota, and for a
folder the command made into a git folder outside every ``.git`` (a ``HEAD``, ``objects`` and ``refs``: git on the
host would take it for a bare repository and run what its ``config`` names). Such a folder's ``HEAD`` is renamed at
once, and the result says so."""

from __future__ import annotations

import contextlib
import enum
import math
import os
import select
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sessions_app.hygiene.outcomes import Outcome, OutputOutcome

from . import quota
from .args import checked
from .context import ToolContext
from .errors import ToolError
from .paths import Root
from .repository import disarm
from .sandbox import Sandboxed, Workspace, sandboxed
from .survey import survey

READ_SIZE = 1 << 16
CANCEL_POLL = 0.1
DRAIN_WITHIN = 5.0
WATCH_EVERY = 1.0
WATCH_FACTOR = 10.0


class Ending(enum.Enum):
    EXITED = "exited"
    TIMED_OUT = "timed out"
    STOPPED = "stopped"
    OVER_QUOTA = "over quota"


class KeptOutput:
    """What a command wrote: all of it up to ``limit`` bytes; past that, its first and last halves."""

    def __init__(self, limit: int) -> None:
        self.limit = max(2, limit)
        self.head_room = self.limit // 2
        self.tail_room = self.limit - self.head_room
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_room - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_room:
                del self.tail[: len(self.tail) - self.tail_room]

    def text(self, ctx: ToolContext) -> str:
        """The kept output decoded, with the cut line where bytes were dropped."""
        if len(self.tail) > self.tail_room:
            del self.tail[: len(self.tail) - self.tail_room]
        if self.total <= len(self.head) + len(self.tail):
            return bytes(self.head + self.tail).decode("utf-8", "replace")
        head, tail = bytes(self.head), bytes(self.tail)
        if b"\n" in head:
            head = head[: head.rindex(b"\n") + 1]
        if b"\n" in tail[:-1]:
            tail = tail[tail.index(b"\n") + 1 :]
        cut = self.total - len(head) - len(tail)
        line = ctx.config.text(
            "output_cut",
            count=quota.size_text(cut),
            total=quota.size_text(self.total),
            kept=quota.size_text(self.head_room),
        )
        separator = "" if not head or head.endswith(b"\n") else "\n"
        return f"{head.decode('utf-8', 'replace')}{separator}{line}\n{tail.decode('utf-8', 'replace')}"


@dataclass(frozen=True)
class Ran:
    """How a command ended: its exit code where it exited (``128 + N`` when signal N ended it)."""

    ending: Ending
    code: int | None
    output: KeptOutput
    seconds: float
    used: int = 0
    disarmed: tuple[str, ...] = ()  # the HEADs of git folders the command made, renamed: their new paths


def run(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Run ``command`` with ``/bin/sh -c`` in the workspace's sandbox; its output as it came, then how it ended."""
    config = ctx.config
    call = checked(args, "run", ctx)
    command, timeout = call.text("command"), call.number("timeout")
    ran = execute(command, timeout, ctx)
    if ran.ending is Ending.TIMED_OUT:
        trailer = config.text("timed_out", seconds=timeout)
    elif ran.ending is Ending.STOPPED:
        trailer = config.text("stopped", seconds=max(1, round(ran.seconds)))
    elif ran.ending is Ending.OVER_QUOTA:
        assert ctx.disk_quota is not None
        trailer = config.text("over_quota", used=quota.size_text(ran.used), quota=quota.size_text(ctx.disk_quota))
    elif ran.code:
        trailer = config.text("exit", code=ran.code)
    else:
        trailer = ""
    for renamed in ran.disarmed:
        line = config.text("git_disarmed", folder=os.path.dirname(renamed), renamed=os.path.basename(renamed))
        trailer = f"{trailer}\n{line}" if trailer else line
    output = ran.output.text(ctx)
    if trailer and output and not output.endswith("\n"):
        output += "\n"
    return OutputOutcome(output + trailer)


def execute(command: str, timeout: int, ctx: ToolContext) -> Ran:
    """Run ``command`` in the sandbox to its end, reading its output as it comes. Whatever it left running is
    killed. The workspace is opened once for the call; a walk of it finds its repositories and what it holds, and
    where it has a quota, no file the command writes may hold more than the space left."""
    with command_workspace(ctx) as (workspace, watch):
        ending, code, kept, seconds = _execute(command, timeout, ctx, workspace, watch)
    return Ran(ending, code, kept, seconds, watch.used, tuple(watch.disarmed))


@contextlib.contextmanager
def command_workspace(ctx: ToolContext) -> Iterator[tuple[Workspace, _Watch]]:
    """The workspace opened for a command (``run``'s, or an MCP server's): the sandbox's view of it, and its watch,
    which walks it once more when the command has ended (its quota kept, a git folder it made disarmed)."""
    try:
        root = Root(ctx)
    except OSError as error:
        raise ToolError(ctx.config.error("command_failed", detail=error.strerror or str(error))) from None
    with root:
        found = survey(root.fd)
        quota.keep(root.path, found.used)
        space_left = None if ctx.disk_quota is None else max(0, ctx.disk_quota - found.used)
        workspace = Workspace(
            root.fd, root.path, tuple(found.git_entries), space_left, git_folders=tuple(found.git_folders)
        )
        limit = None if ctx.disk_quota is None else max(ctx.disk_quota, found.used)
        watch = _Watch(root, limit, set(found.git_folders))
        try:
            yield workspace, watch
        finally:
            watch.walk()


@dataclass
class _Watch:
    """Walks the workspace while a command runs, and once when it ends: ``due`` says when; ``over`` whether it
    passed ``limit`` (its quota, or what it held at the start where that was more: a command that only frees space
    goes on). Each walk keeps its measure for the file tools, and renames the ``HEAD`` of every git folder that was
    not one when the command started (``disarmed``)."""

    root: Root
    limit: int | None
    git_folders: set[str]
    next_at: float = 0.0
    used: int = 0
    disarmed: list[str] = field(default_factory=list)

    def due(self, now: float) -> float:
        return self.next_at - now

    def over(self) -> bool:
        started = time.monotonic()
        self.walk()
        took = time.monotonic() - started
        self.next_at = time.monotonic() + max(WATCH_EVERY, WATCH_FACTOR * took)
        return self.limit is not None and self.used > self.limit

    def walk(self) -> None:
        found = survey(self.root.fd)
        self.used = quota.keep(self.root.path, found.used)
        for folder in found.git_folders:
            if folder not in self.git_folders:
                renamed = disarm(self.root.fd, self.root.path, folder)
                if renamed is not None:
                    self.disarmed.append(renamed)


def _execute(
    command: str, timeout: int, ctx: ToolContext, workspace: Workspace, watch: _Watch
) -> tuple[Ending, int | None, KeptOutput, float]:
    kept = KeptOutput(ctx.sandbox.output_max_bytes)
    read_end, write_end = os.pipe()
    started = time.monotonic()
    try:
        with sandboxed(command, workspace, write_end, ctx) as running:
            os.close(write_end)
            write_end = -1
            watch.next_at = started + WATCH_EVERY
            ending = _follow(running, read_end, kept, started + timeout, ctx, watch)
            if ending is not Ending.EXITED:
                running.kill()
            returncode = running.process.wait()
        _drain(read_end, kept)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    code = (128 - returncode if returncode < 0 else returncode) if ending is Ending.EXITED else None
    return ending, code, kept, time.monotonic() - started


def _follow(
    running: Sandboxed, read_end: int, kept: KeptOutput, deadline: float, ctx: ToolContext, watch: _Watch
) -> Ending:
    """Read the output until the sandbox's first process exits (left unreaped, so its pid stays its own), or
    until the time is up, Stop, or the quota says otherwise."""
    waiting = select.poll()
    waiting.register(read_end, select.POLLIN)
    with _exit_of(running.process.pid) as exited:
        if exited is not None:
            waiting.register(exited, select.POLLIN)
        while True:
            now = time.monotonic()
            if ctx.cancelled():
                return Ending.STOPPED
            if now >= deadline:
                return Ending.TIMED_OUT
            if watch.due(now) <= 0 and watch.over():
                return Ending.OVER_QUOTA
            wait = min(deadline - now, CANCEL_POLL, watch.due(now))
            for fd, _ in waiting.poll(max(0, math.ceil(wait * 1000))):
                if fd == read_end:
                    data = os.read(read_end, READ_SIZE)
                    if data:
                        kept.add(data)
                    else:
                        waiting.unregister(read_end)
            if _has_exited(running.process.pid, exited):
                return Ending.EXITED


@contextlib.contextmanager
def _exit_of(pid: int) -> Iterator[int | None]:
    """A descriptor that turns readable when ``pid`` exits, where the kernel has ``pidfd_open``."""
    try:
        fd: int | None = os.pidfd_open(pid)
    except OSError:
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _has_exited(pid: int, pidfd: int | None) -> bool:
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], 0)[0])
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _drain(read_end: int, kept: KeptOutput) -> None:
    """Read what is left once the sandbox is gone (its processes may take a moment to close the pipe)."""
    deadline = time.monotonic() + DRAIN_WITHIN
    waiting = select.poll()
    waiting.register(read_end, select.POLLIN)
    while time.monotonic() < deadline:
        if not waiting.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
            return
        data = os.read(read_end, READ_SIZE)
        if not data:
            return
        kept.add(data)
