"""``grep``'s engine: ripgrep (``rg``, linear-time Rust regexes) in a subprocess, its JSON read from the
pipe as it comes, ended by the time limit or by Stop. Python never reads the searched files."""

from __future__ import annotations

import base64
import json
import os
import selectors
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .context import ToolContext
from .errors import ToolError, one_line

RG_THREADS = 1
"""One core for one grep. With more threads rg also holds each file's whole output in memory before
writing it (measured: 600 MB for one 200 MB file whose every line matched); with one it streams."""

STDIN_PATH = "<stdin>"
_FLAGS = (
    "--no-config",
    "--json",
    "--no-messages",
    "--no-ignore-messages",
    "--no-ignore-global",
    "--crlf",
    f"--threads={RG_THREADS}",
)
_READ_BYTES = 1 << 16
_STDERR_KEPT = 1 << 16
_POLL_SECONDS = 0.05
_LINE_OVERHEAD = 16


@dataclass(frozen=True)
class RgQuery:
    """What to search for: a Rust regex, case folding, and an optional ``--glob`` filter."""

    pattern: str
    ignore_case: bool = False
    glob: str | None = None


@dataclass
class FileMatches:
    """A file's matching lines as ``(line number, bytes without the newline)``; ``binary`` when rg found
    a NUL byte in the file (its lines are then dropped)."""

    lines: list[tuple[int, bytes]] = field(default_factory=list)
    binary: bool = False


def rg_executable(ctx: ToolContext) -> str:
    """The ``rg`` that the ``ripgrep`` wheel installs next to this Python; else the one on ``PATH``."""
    folders = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    found = shutil.which("rg", path=os.pathsep.join([*folders, os.environ.get("PATH", os.defpath)]))
    if found is None:
        raise ToolError(ctx.config.error("grep_missing", folder=folders[0]))
    return found


def rg_search(
    query: RgQuery,
    ctx: ToolContext,
    *,
    folder_fd: int | None = None,
    file_fd: int | None = None,
    skipped: tuple[str, ...] = (),
) -> dict[str, FileMatches]:
    """Run rg over the folder open as ``folder_fd`` (the answer's paths are relative to it, ``./``
    first) or over the regular file open as ``file_fd`` (answered as ``<stdin>``), leaving out the files whose
    names match a glob of ``skipped`` (case-insensitive).

    Files that ``.gitignore`` ignores, hidden files and binary files are skipped as rg skips them by
    default, and symlinks are not followed. Raises the ``ToolError`` to answer when the pattern or the
    glob is refused, the time limit passes, ``ctx.cancelled()`` turns true, or the matches pass
    ``ctx.grep_max_bytes``; rg is killed then.
    """
    config = ctx.config
    _require_usable(query.pattern, "bad_regex", "pattern", ctx)
    if query.glob is not None:
        _require_usable(query.glob, "bad_glob", "glob", ctx)
    argv = [rg_executable(ctx), *_FLAGS]
    if query.ignore_case:
        argv.append("--ignore-case")
    if query.glob is not None:
        argv.append(f"--glob={query.glob}")
    argv += [f"--iglob=!{glob}" for glob in skipped]  # after the query's: a later glob wins
    argv += [f"--regexp={query.pattern}", "--", "." if folder_fd is not None else "-"]
    try:
        process = subprocess.Popen(
            argv,
            cwd=f"/proc/self/fd/{folder_fd}" if folder_fd is not None else "/",
            pass_fds=(folder_fd,) if folder_fd is not None else (),
            env={},
            stdin=file_fd if file_fd is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as error:
        raise ToolError(config.error("grep_failed", detail=error.strerror or error)) from None
    reader = _Reader(ctx.grep_max_bytes)
    try:
        stderr = _pump(process, reader, ctx)
        code = process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    if (code == 2 and stderr.strip()) or code not in (0, 1, 2):
        raise ToolError(_refusal(query, stderr, code, ctx))
    return reader.files


def rg_files(ctx: ToolContext, *, folder_fd: int, globs: tuple[str, ...], iglobs: tuple[str, ...] = ()) -> list[str]:
    """The files rg would search below the folder open as ``folder_fd`` (relative to it, ``./`` first) that match
    ``globs`` and ``iglobs`` (case-insensitive): ignored, hidden files skipped, symlinks not followed."""
    argv = [
        rg_executable(ctx),
        "--no-config",
        "--files",
        "--null",
        "--no-messages",
        "--no-ignore-global",
        *(f"--glob={glob}" for glob in globs),
        *(f"--iglob={glob}" for glob in iglobs),
        "--",
        ".",
    ]
    try:
        done = subprocess.run(
            argv,
            cwd=f"/proc/self/fd/{folder_fd}",
            pass_fds=(folder_fd,),
            env={},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=ctx.grep_timeout,
        )
    except subprocess.TimeoutExpired:
        raise ToolError(ctx.config.error("grep_timed_out", seconds=f"{ctx.grep_timeout:g}")) from None
    except OSError as error:
        raise ToolError(ctx.config.error("grep_failed", detail=error.strerror or error)) from None
    return sorted(os.fsdecode(name) for name in done.stdout.split(b"\0") if name)


class _TooMuch(Exception):
    pass


class _Reader:
    """rg's JSON messages, split from the pipe's bytes, kept as the matches of each file."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pending = bytearray()
        self.kept = 0
        self.files: dict[str, FileMatches] = {}

    def feed(self, chunk: bytes) -> None:
        self.pending += chunk
        start = 0
        while (end := self.pending.find(b"\n", start)) >= 0:
            self._message(json.loads(self.pending[start:end]))
            start = end + 1
        del self.pending[:start]
        if len(self.pending) > self.max_bytes:
            raise _TooMuch

    def _message(self, message: Mapping[str, object]) -> None:
        kind, data = message.get("type"), message.get("data")
        if kind not in ("match", "end") or not isinstance(data, dict):
            return
        path = os.fsdecode(_data_bytes(data["path"]))
        matches = self.files.setdefault(path, FileMatches())
        if kind == "match":
            text = _data_bytes(data["lines"])
            line = text[:-2] if text.endswith(b"\r\n") else text.removesuffix(b"\n")  # a lone \r stays
            matches.lines.append((int(data["line_number"]), line))
            self.kept += len(line) + len(path) + _LINE_OVERHEAD
            if self.kept > self.max_bytes:
                raise _TooMuch
        elif data.get("binary_offset") is not None:
            self.kept -= sum(len(line) + len(path) + _LINE_OVERHEAD for _, line in matches.lines)
            matches.lines.clear()
            matches.binary = True


def _pump(process: subprocess.Popen[bytes], reader: _Reader, ctx: ToolContext) -> bytes:
    """Feed rg's output to ``reader`` until rg exits, checking Stop and the time limit between reads;
    the start of its error output."""
    config = ctx.config
    stderr = bytearray()
    deadline = time.monotonic() + ctx.grep_timeout
    assert process.stdout is not None and process.stderr is not None
    out, err = process.stdout.fileno(), process.stderr.fileno()
    with selectors.DefaultSelector() as selector:
        for fd in (out, err):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if ctx.cancelled():
                raise ToolError(config.error("grep_stopped"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ToolError(config.error("grep_timed_out", seconds=f"{ctx.grep_timeout:g}"))
            for key, _ in selector.select(min(_POLL_SECONDS, remaining)):
                try:
                    chunk = os.read(key.fd, _READ_BYTES)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                elif key.fd == out:
                    try:
                        reader.feed(chunk)
                    except _TooMuch:
                        raise ToolError(config.error("grep_too_much", limit=ctx.grep_max_bytes)) from None
                elif len(stderr) < _STDERR_KEPT:
                    stderr += chunk
    while process.poll() is None:
        if ctx.cancelled():
            raise ToolError(config.error("grep_stopped"))
        if time.monotonic() >= deadline:
            raise ToolError(config.error("grep_timed_out", seconds=f"{ctx.grep_timeout:g}"))
        time.sleep(0.005)
    return bytes(stderr)


def _data_bytes(value: object) -> bytes:
    """rg's ``{"text": …}`` or, for bytes that are not UTF-8, ``{"bytes": base64}``, as bytes."""
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return str(value["text"]).encode("utf-8")
        if isinstance(value.get("bytes"), str):
            return base64.b64decode(str(value["bytes"]))
    return b""


def _require_usable(text: str, key: str, name: str, ctx: ToolContext) -> None:
    """Refuse a pattern or glob that cannot be an argument of a process: a NUL, or a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        usable = False
    else:
        usable = "\x00" not in text
    if not usable:
        raise ToolError(ctx.config.error(key, **{name: text}, detail=ctx.config.errors["unusable_text"]))


def _refusal(query: RgQuery, stderr: bytes, code: int, ctx: ToolContext) -> str:
    """rg's own error as one line, behind the text that says what it concerns."""
    detail = rg_error_line(stderr.decode("utf-8", "replace")) or f"exit {code}"
    config = ctx.config
    if detail.startswith("error parsing glob") and query.glob is not None:
        return config.error("bad_glob", glob=query.glob, detail=detail)
    if "regex" in detail:
        return config.error("bad_regex", pattern=query.pattern, detail=detail)
    return config.error("grep_failed", detail=detail)


def rg_error_line(stderr: str) -> str:
    """The first meaningful line of rg's error output; a ``regex parse error:`` heading gets the
    ``error: …`` line that says what is wrong (the pattern and its caret lines are dropped)."""
    lines = [line.strip().removeprefix("rg: ") for line in stderr.splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0]
    if first.endswith(":"):
        reason = next((line.removeprefix("error: ") for line in lines[1:] if line.startswith("error: ")), None)
        if reason is not None:
            return one_line(f"{first} {reason}")
    return one_line(first)
