"""``run``: a shell command in a sandbox holding the workspace (see ``sandbox``), its output spooled to a
file while it runs."""

from __future__ import annotations

import errno
import math
import os
import select
import tempfile
import time
from collections.abc import Mapping
from typing import BinaryIO

from sessions_app.hygiene.outcomes import Outcome, OutputOutcome

from .args import Args
from .context import ToolContext
from .errors import ToolError
from .paths import workspace_root
from .sandbox import sandboxed

_POLL_FIRST, _POLL_MAX = 0.005, 0.1


def run(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Run ``command`` with ``/bin/sh -c`` in the workspace's sandbox; its output as it came, then its exit."""
    config = ctx.config
    call = Args(args, "run", config)
    command = call.text("command")
    timeout = min(call.number("timeout", ctx.run_timeout, minimum=1), ctx.run_max_timeout)
    with tempfile.TemporaryFile(dir=ctx.spool_dir, prefix="cachet-run-") as spool:
        code = execute(command, timeout, spool, ctx)
        if code is None:
            trailer = config.text("timed_out", seconds=timeout)
        elif code != 0:
            trailer = config.text("exit", code=code)
        else:
            trailer = ""
        return OutputOutcome(collect(spool, trailer))


def execute(command: str, timeout: int, spool: BinaryIO, ctx: ToolContext) -> int | None:
    """Run ``command`` in the sandbox to its end with its output going to ``spool``; its exit code
    (``128 + N`` when signal N ended it), or ``None`` when it timed out. Whatever it left running is killed."""
    root = workspace_root(ctx)
    if not os.path.isdir(root):
        raise ToolError(ctx.config.error("command_failed", detail=os.strerror(errno.ENOENT)))
    with sandboxed(command, root, spool, ctx) as running:
        exited = _wait_unreaped(running.process.pid, time.monotonic() + timeout)
        if not exited:
            running.kill()
        returncode = running.process.wait()
    if not exited:
        return None
    return 128 - returncode if returncode < 0 else returncode


def collect(spool: BinaryIO, trailer: str) -> str:
    """The spooled output with ``trailer`` on a line of its own, read once and decoded."""
    if trailer:
        spool.seek(0, os.SEEK_END)
        if spool.tell() > 0:
            spool.seek(-1, os.SEEK_END)
            if spool.read(1) != b"\n":
                spool.write(b"\n")
        spool.write(trailer.encode("utf-8"))
    spool.seek(0)
    return spool.read().decode("utf-8", "replace")


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits or ``deadline``, leaving it unreaped so its pid stays its own."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return _poll_unreaped(pid, deadline)
    try:
        waiting = select.poll()
        waiting.register(pidfd, select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if waiting.poll(max(0, math.ceil(remaining * 1000))):
                return True
            if remaining <= 0:
                return False
    finally:
        os.close(pidfd)


def _poll_unreaped(pid: int, deadline: float) -> bool:
    pause = _POLL_FIRST
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, _POLL_MAX)
