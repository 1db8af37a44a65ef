"""Benchmark: how fast Stop ends a waiting model stream, and what reading a stream costs the process, for the
model client as it is (``chat.agent.model``: httpx's async client read on the caller's event loop, a ``Cancel``
cancelling the read at once) beside the client of revision ``--old`` (by default c1d4e61: a private event loop
per request driven from the reply's thread), run from a git worktree of that revision in a process of its own.

Stop: the server sends the role delta, then only a keep-alive comment every second (a long prompt being read,
or a stall); a few tenths of a second in, the cancel is set (from another task; the old client: another thread)
and the time until the read raises ``ModelCancelled`` is measured.

Reading: an answer of ``--chunks`` deltas sent as fast as the server writes them; the CPU of this process
(``time.process_time``) per delta.

The scripted server runs in a process of its own.

    python bench/model_stream_bench.py [--runs 20] [--chunks 2000] [--old c1d4e61]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat.agent import model  # noqa: E402
from testing.interrupts import sigterm_as_interrupt  # noqa: E402
from testing.safe_git import git_argv, git_env  # noqa: E402

BODY = json.dumps({"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "Go on."}]}).encode()
TIMEOUTS = {"connect": 5.0, "first_token": 60.0, "between_chunks": 60.0}


def _serve(steps: list[dict[str, Any]]) -> tuple[subprocess.Popen[bytes], str]:
    script = Path(tempfile.mkdtemp()) / "steps.json"
    script.write_text(json.dumps(steps))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [sys.executable, "-m", "testing.scripted_server", "--port", str(port), "--script", str(script)]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return server, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("the scripted server did not start")


async def _stop_latency(base_url: str) -> float:
    """Milliseconds from ``cancel.set()`` (in another task) to ``ModelCancelled`` in the reading one."""
    cancel = model.Cancel()
    stream = model.stream_chat(
        base_url=base_url, api_key=None, body=BODY, timeouts=model.Timeouts(**TIMEOUTS), cancel=cancel
    )
    set_at: list[float] = []

    async def stop() -> None:
        await asyncio.sleep(0.3 + random.random() * 0.4)  # somewhere in the server's silence
        set_at.append(time.perf_counter())
        cancel.set()

    stopping = asyncio.create_task(stop())
    try:
        stream.start()
        async for _ in stream:
            pass
    except model.ModelCancelled:
        return (time.perf_counter() - set_at[0]) * 1000
    finally:
        await stopping
        await stream.aclose()
    raise SystemExit("the stream ended without being cancelled")


async def _reading_cpu(base_url: str, chunks: int) -> float:
    """Microseconds of this process's CPU per delta of a fast answer."""
    stream = model.stream_chat(base_url=base_url, api_key=None, body=BODY, timeouts=model.Timeouts(**TIMEOUTS))
    started = time.process_time()
    done = await stream.complete()
    spent = time.process_time() - started
    assert len(done.text) == chunks, len(done.text)
    return spent * 1e6 / chunks


@dataclass
class Figures:
    """One client's figures: Stop latencies (ms) and CPU per delta (µs), or why there are none."""

    stops: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    missing: str = ""


async def _measured(base_url: str, runs: int, chunks: int, rounds: int) -> Figures:
    figures = Figures()
    for _ in range(runs):
        figures.stops.append(await _stop_latency(base_url))
    for _ in range(rounds):
        figures.cpu.append(await _reading_cpu(base_url, chunks))
    return figures


LINE = re.compile(r"^(now, Cancel|now)\s+([\d.]+)")


def _old_figures(worktree: Path, runs: int, chunks: int, rounds: int) -> Figures:
    ran = subprocess.run(
        [
            sys.executable,
            "bench/model_stream_bench.py",
            *("--runs", str(runs), "--chunks", str(chunks), "--rounds", str(rounds)),
            *("--old", "0000000"),  # a revision git cannot show: that copy compares no client of its own
        ],
        cwd=worktree,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    figures = Figures()
    section = ""
    for line in ran.stdout.splitlines():
        if line.startswith("Stop during"):
            section = "stop"
        elif line.startswith("Reading an answer"):
            section = "cpu"
        matched = LINE.match(line)
        if matched and section == "stop" and matched.group(1) == "now, Cancel":
            figures.stops.append(float(matched.group(2)))
        elif matched and section == "cpu" and matched.group(1) == "now":
            figures.cpu.append(float(matched.group(2)))
    if not figures.stops or not figures.cpu:
        figures.missing = f"its benchmark printed nothing to compare (exit {ran.returncode}): {ran.stderr[-300:]}"
    return figures


def _old(ref: str, runs: int, chunks: int, rounds: int) -> Figures:
    """The client of ``ref`` measured by that revision's own copy of this benchmark, in a worktree of its own."""
    worktree = Path(tempfile.mkdtemp(prefix="cachet-model-old-")) / "tree"
    added = subprocess.run(
        git_argv("worktree", "add", "--detach", str(worktree), ref), cwd=ROOT, capture_output=True, env=git_env()
    )
    if added.returncode != 0:
        return Figures(missing=f"git could not check out {ref}: {added.stderr.decode(errors='replace').strip()}")
    try:
        figures = Figures()
        for tries in (runs, max(3, runs // 4)):  # that revision's Stop of a plain Event can miss, rarely: once more
            figures = _old_figures(worktree, tries, chunks, rounds)
            if not figures.missing:
                break
        return figures
    finally:
        subprocess.run(git_argv("worktree", "remove", "--force", str(worktree)), cwd=ROOT, env=git_env(), check=False)


def main() -> None:
    """Print the Stop latency and the CPU per delta of the client beside the old one's, and their ratios."""
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old", default="c1d4e61", help="the revision whose client is compared ('' for none)")
    args = parser.parse_args()

    stall = {"fault": "keepalive", "delay": 1.0}
    answer = {"text": "x" * args.chunks, "chunk_size": 1}
    server, base_url = _serve([stall] * args.runs + [answer] * args.rounds)
    try:
        now = asyncio.run(_measured(base_url, args.runs, args.chunks, args.rounds))
    finally:
        server.terminate()
        server.wait(10)
    before = _old(args.old, args.runs, args.chunks, args.rounds) if args.old else Figures(missing="not asked")

    print(f"Stop during the server's silence, {args.runs} runs: ms from cancel.set() to ModelCancelled")
    print(f"{'client':<22} {'median':>8} {'p90':>8} {'max':>8}")
    ordered = sorted(now.stops)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    print(f"{'now':<22} {statistics.median(ordered):>8.2f} {p90:>8.2f} {max(ordered):>8.2f}")
    if before.stops:
        print(f"{f'before ({args.old})':<22} {before.stops[0]:>8.2f}  (median only)")
    print(f"\nReading an answer of {args.chunks} deltas, {args.rounds} rounds: CPU µs per delta (median)")
    print(f"{'now':<22} {statistics.median(now.cpu):>8.1f}")
    if before.cpu:
        ratio = statistics.median(now.cpu) / statistics.median(before.cpu)
        print(f"{f'before ({args.old})':<22} {statistics.median(before.cpu):>8.1f}   now/before = {ratio:.2f}")
    if before.missing:
        print(f"(the client of {args.old or 'an old revision'} is left out: {before.missing})")


if __name__ == "__main__":
    main()
