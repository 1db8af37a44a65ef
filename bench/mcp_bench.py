"""What one MCP tool call costs Cachet, measured side by side with what peers do.

Cachet opens a connection per call (a listing, then the call), and runs a command server in the workspace's
sandbox for that one call; LibreChat and Open WebUI keep one session open per server and send each call on it.
The server is the project's real one (``testing/mcp_server.py``, the official SDK), over streamable HTTP and over
stdio. Prints the median and 90th percentile per call of each way, and the ratios to the kept session.

    python bench/mcp_bench.py [--calls 30]

Run as root (a command runs as the sandbox user, as in production) on a machine with bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _figures(name: str, seconds: list[float], base: float | None) -> str:
    median = statistics.median(seconds) * 1000
    p90 = sorted(seconds)[int(0.9 * (len(seconds) - 1))] * 1000
    ratio = f"{median / (base * 1000):6.1f}x" if base else "   1.0x"
    return f"{name:<52} median {median:8.1f} ms   p90 {p90:8.1f} ms   {ratio}"


async def _timed(calls: int, one: Callable[[], Awaitable[object]]) -> list[float]:
    await one()  # the first call pays for imports: not counted
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        await one()
        seconds.append(time.perf_counter() - started)
    return seconds


async def _kept_session(calls: int, url: str) -> list[float]:
    from mcp import Client

    async with Client(url, mode="legacy", cache=None) as client:
        return await _timed(calls, lambda: client.call_tool("lookup", {"term": "x"}))


async def _kept_stdio(calls: int) -> list[float]:
    from mcp import Client, StdioServerParameters

    server = StdioServerParameters(command=sys.executable, args=["-m", "testing.mcp_server"], cwd=str(ROOT))
    async with Client(server, mode="legacy", cache=None) as client:
        return await _timed(calls, lambda: client.call_tool("lookup", {"term": "x"}))


def main(argv: list[str] | None = None) -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    for noisy in ("httpx", "httpx2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from chat.agent.mcp import McpAddress, mcp_call
    from chat.agent.workspace import folder_context
    from sessions_app.models import Workspace
    from testing.mcp_server import McpHttpServer, sandbox_command
    from tests.sandbox_kit import for_commands

    command, folders = sandbox_command()
    roots = os.environ.get("CACHET_WORKSPACE_ROOTS", "").split(os.pathsep)[0] or str(ROOT / ".cachet" / "workspaces")
    Path(roots).mkdir(parents=True, exist_ok=True)
    folder = for_commands(Path(tempfile.mkdtemp(prefix="mcp-bench-", dir=roots)))
    context = folder_context(Workspace(name="bench", folder=str(folder), allow_commands=True))
    load = os.getloadavg()
    print(f"{args.calls} calls of lookup each; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
    with McpHttpServer() as server:
        http = McpAddress(url=server.url)
        stdio = McpAddress(command=command, read_only=folders, workspace=context)

        async def cachet(address: McpAddress) -> object:
            return await mcp_call(address, tool="lookup", arguments={"term": "x"}, timeout=30)

        kept = asyncio.run(_kept_session(args.calls, server.url))
        fresh = asyncio.run(_timed(args.calls, lambda: cachet(http)))
        kept_stdio = asyncio.run(_kept_stdio(args.calls))
        sandboxed = asyncio.run(_timed(args.calls, lambda: cachet(stdio)))
    base = statistics.median(kept)
    print(_figures("HTTP, one session kept open (LibreChat, Open WebUI)", kept, None))
    print(_figures("HTTP, a connection per call (Cachet)", fresh, base))
    print(_figures("stdio, one process kept, not sandboxed (peers)", kept_stdio, base))
    print(_figures("stdio, a sandboxed process per call (Cachet)", sandboxed, base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
