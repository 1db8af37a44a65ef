"""A real MCP server, made with the official SDK (``mcp``), for tests and probes: a team's notes.

``python -m testing.mcp_server --http PORT`` serves it over streamable HTTP at ``http://127.0.0.1:PORT/mcp``;
``python -m testing.mcp_server`` over stdio. Its tools: ``lookup(term)`` (read-only), ``record(text)`` (writes),
``slow(seconds)`` (read-only; sleeps, for Stop and timeouts), ``fail()`` (answers an error), ``lines(count)``
(read-only; that many lines, for the cap), ``where(paths)`` (read-only; its user, folder and the paths it sees).
``--instructions TEXT`` sets what it tells a client it should know; ``--without NAME`` leaves a tool out (a server
that dropped one).

``McpHttpServer`` runs it in a process of its own on a free port for the length of a ``with``; ``sandbox_command``
is the command that runs it over stdio in a workspace's sandbox, with the folders it must read there.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

INSTRUCTIONS = "Look a term up in the team's notes before you answer about it."
ROOT = Path(__file__).resolve().parent.parent


def build(*, instructions: str = INSTRUCTIONS, without: Sequence[str] = ()) -> object:
    """The server, its tools registered (all but ``without``)."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer("notes", instructions=instructions or None, log_level="WARNING")
    recorded: list[str] = []
    reading = ToolAnnotations(read_only_hint=True)

    async def lookup(term: str) -> str:
        """Look a term up in the team's notes."""
        return f"notes on {term}: ship on Friday"

    async def record(text: str) -> str:
        """Record a line in the team's notes."""
        recorded.append(text)
        return f"recorded {len(recorded)}: {text}"

    async def slow(seconds: float) -> str:
        """Wait, then answer."""
        await anyio.sleep(seconds)
        return f"waited {seconds} s"

    async def fail() -> str:
        """Always fails."""
        raise ValueError("the notes are locked")

    async def lines(count: int) -> str:
        """That many numbered lines."""
        return "\n".join(f"line {n}" for n in range(1, count + 1))

    async def where(paths: list[str]) -> str:
        """Who the server runs as, where, and which of ``paths`` it can see."""
        seen = {path: os.path.exists(path) for path in paths}
        return json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "sees": seen}, sort_keys=True)

    tools: dict[str, tuple[Any, ToolAnnotations | None]] = {
        "lookup": (lookup, reading),
        "record": (record, None),
        "slow": (slow, reading),
        "fail": (fail, None),
        "lines": (lines, reading),
        "where": (where, reading),
    }
    for name, (function, hints) in tools.items():
        if name not in without:
            server.tool(name=name, annotations=hints)(function)
    return server


def sandbox_command(tag: str = "") -> tuple[str, tuple[str, ...]]:
    """The command that serves it over stdio inside a sandbox (the system's Python 3, this project's packages on
    its path), and the folders it reads: the packages and this folder, bound read-only. ``tag`` marks its command
    line, so a test finds its own processes."""
    import mcp

    packages = str(Path(mcp.__file__).resolve().parent.parent)
    command = f"PYTHONPATH={packages}:{ROOT} exec /usr/bin/python3 -m testing.mcp_server"
    command += f" --without={tag}" if tag else ""
    return command, (packages, str(ROOT / "testing"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class McpHttpServer:
    """The notes server over streamable HTTP, in its own process, while used as a context manager."""

    def __init__(self, *, instructions: str = INSTRUCTIONS, without: Sequence[str] = (), port: int = 0) -> None:
        self.port = port or free_port()
        self.instructions = instructions
        self.without = tuple(without)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> McpHttpServer:
        args = [sys.executable, "-m", "testing.mcp_server", "--http", str(self.port)]
        args += ["--instructions", self.instructions, *(f"--without={name}" for name in self.without)]
        self._process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the MCP server exited with {self._process.returncode}")
            try:
                httpx.get(self.url, timeout=1)
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("the MCP server did not answer within 30 s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> McpHttpServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve the notes server over stdio, or streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser(description="A real MCP server (the official SDK) for tests: a team's notes.")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    parser.add_argument("--instructions", default=INSTRUCTIONS)
    parser.add_argument("--without", action="append", default=[], metavar="TOOL")
    args = parser.parse_args(argv)
    server = build(instructions=args.instructions, without=args.without)
    if args.http:
        server.run("streamable-http", port=args.http)  # type: ignore[attr-defined]
    else:
        server.run("stdio")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
