"""``run``: a shell command in the workspace, its output spooled to a file while it runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from typing import BinaryIO

from sessions_app.hygiene.outcomes import Outcome, OutputOutcome

from .args import Args
from .context import ToolContext
from .errors import ToolError
from .paths import workspace_root

KILL_GRACE = 2.0
_POLL_FIRST, _POLL_MAX = 0.005, 0.1
_KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "HOME", "USER", "LOGNAME", "TMPDIR")
_SET_ENV = {"TERM": "dumb", "NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat", "SHELL": "/bin/sh"}


def run(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Run ``command`` with ``/bin/sh -c`` in the workspace; its output as it came, then its exit."""
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
    """Run ``command`` to its end with its output going to ``spool``; its exit code (``128 + N``
    when signal N ended it), or ``None`` when it timed out. Whatever it left running is killed."""
    root = workspace_root(ctx)
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=root,
            env=_environment(root),
            stdin=subprocess.DEVNULL,
            stdout=spool,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as error:
        detail = error.strerror or str(error)
        raise ToolError(ctx.config.error("command_failed", detail=detail)) from None
    exited = False
    try:
        exited = _wait_unreaped(process.pid, time.monotonic() + timeout)
        if not exited:
            _signal_group(process.pid, signal.SIGTERM)
            _wait_unreaped(process.pid, time.monotonic() + KILL_GRACE)
    finally:
        _signal_group(process.pid, signal.SIGKILL)
        returncode = process.wait()
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
    """Wait until ``pid`` exits or ``deadline``, leaving it unreaped so its group id stays its own."""
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


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _environment(root: str) -> dict[str, str]:
    environment = {name: os.environ[name] for name in _KEPT_ENV if name in os.environ}
    environment.update((name, value) for name, value in os.environ.items() if name.startswith("LC_"))
    environment.setdefault("PATH", os.defpath)
    environment.update(_SET_ENV)
    environment["PWD"] = root
    return environment
