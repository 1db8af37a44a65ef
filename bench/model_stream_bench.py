"""Benchmark: how fast Stop ends a waiting model stream, and what reading a stream costs the process, for the
model client as it is (``chat.agent.model``: read on the caller's thread, woken by a ``Cancel``) and as it was
before (``chat/agent/model_client.py`` at ``--old``: a worker thread per request, a queue polled every 50 ms).

Stop: the server sends the role delta, then only a keep-alive comment every second (a long prompt being read,
or a stall); a few tenths of a second in, another thread sets the cancel, and the time until the stream's own
thread has raised ``ModelCancelled`` is measured. The current client is run with a ``Cancel`` and with a plain
``threading.Event`` (which it looks at every 50 ms, for callers not moved to ``Cancel`` yet).

Sending: on a client whose connection is kept from the request before, how long ``start(wait=False)`` (which
the loop calls before it writes the request's record) takes, and whether the request is written by then.

Reading: an answer of ``--chunks`` deltas sent as fast as the server writes them; the CPU of this process
(``time.process_time``: the reading thread and, for the old client, its worker) per delta.

The scripted server runs in a process of its own.

    python bench/model_stream_bench.py [--runs 20] [--chunks 2000] [--old 509fe05]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat.agent import model  # noqa: E402
from testing.safe_git import git_argv, git_env  # noqa: E402

BODY = json.dumps({"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "Go on."}]}).encode()
TIMEOUTS = {"connect": 5.0, "first_token": 60.0, "between_chunks": 60.0}


def _old_client(ref: str) -> ModuleType | None:
    """The model client module as it was at ``ref``, or ``None`` where git cannot show it."""
    shown = subprocess.run(
        git_argv("show", f"{ref}:chat/agent/model_client.py"), cwd=ROOT, capture_output=True, check=False, env=git_env()
    )
    if shown.returncode != 0:
        return None
    path = Path(tempfile.mkdtemp()) / "old_model_client.py"
    path.write_bytes(shown.stdout)
    spec = importlib.util.spec_from_file_location("old_model_client", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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


def _stop_latency(client: ModuleType, base_url: str, cancel: threading.Event) -> float:
    """Milliseconds from ``cancel.set()`` on another thread to ``ModelCancelled`` on this one."""
    stream = client.stream_chat(
        base_url=base_url, api_key=None, body=BODY, timeouts=client.Timeouts(**TIMEOUTS), cancel=cancel
    )
    set_at: list[float] = []

    def stop() -> None:
        time.sleep(0.3 + random.random() * 0.4)  # somewhere in the server's silence
        set_at.append(time.perf_counter())
        cancel.set()

    threading.Thread(target=stop, daemon=True).start()
    try:
        for _ in stream:
            pass
    except client.ModelCancelled:
        return (time.perf_counter() - set_at[0]) * 1000
    raise SystemExit("the stream ended without being cancelled")


def _reading_cpu(client: ModuleType, base_url: str, chunks: int) -> float:
    """Microseconds of this process's CPU per delta of a fast answer."""
    stream = client.stream_chat(base_url=base_url, api_key=None, body=BODY, timeouts=client.Timeouts(**TIMEOUTS))
    started = time.process_time()
    done = stream.complete()
    spent = time.process_time() - started
    assert len(done.text) == chunks, len(done.text)
    return spent * 1e6 / chunks


def _send_ahead(base_url: str, runs: int) -> tuple[int, float]:
    """How many of ``runs`` requests ``start(wait=False)`` wrote whole, and its median microseconds."""
    client = model.ModelClient()
    written, spent = 0, []
    try:
        for _ in range(runs):
            stream = model.stream_chat(
                base_url=base_url, api_key=None, body=BODY, timeouts=model.Timeouts(**TIMEOUTS), client=client
            )
            started = time.perf_counter()
            stream.start(wait=False)
            spent.append((time.perf_counter() - started) * 1e6)
            written += stream.sent
            stream.complete()
    finally:
        client.close()
    return written, statistics.median(spent[1:] or spent)  # the first one connects


def main() -> None:
    """Print the Stop latency and the CPU per delta of each client, side by side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old", default="509fe05", help="the commit whose chat/agent/model_client.py is the old one")
    args = parser.parse_args()

    old = _old_client(args.old)
    stops: dict[str, tuple[ModuleType, Callable[[], threading.Event]]] = {
        "now, Cancel": (model, model.Cancel),
        "now, plain Event": (model, threading.Event),
    }
    readers: dict[str, ModuleType] = {"now": model}
    if old is not None:
        stops["before, plain Event"] = (old, threading.Event)
        readers["before"] = old
    stall = {"fault": "keepalive", "delay": 1.0}
    answer = {"text": "x" * args.chunks, "chunk_size": 1}
    steps = [stall] * (args.runs * len(stops)) + [answer] * (args.rounds * len(readers))
    steps += [{"text": "ok"}] * (args.runs + 1)
    server, base_url = _serve(steps)
    latencies: dict[str, list[float]] = {name: [] for name in stops}
    cpu: dict[str, list[float]] = {name: [] for name in readers}
    try:
        for _ in range(args.runs):
            for name, (client, make_cancel) in stops.items():
                latencies[name].append(_stop_latency(client, base_url, make_cancel()))
        for _ in range(args.rounds):
            for name, client in readers.items():
                cpu[name].append(_reading_cpu(client, base_url, args.chunks))
        written, ahead = _send_ahead(base_url, args.runs + 1)
    finally:
        server.terminate()
        server.wait(10)

    print(f"Stop during the server's silence, {args.runs} runs: ms from cancel.set() to ModelCancelled")
    print(f"{'client':<22} {'median':>8} {'p90':>8} {'max':>8}")
    for name, values in latencies.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        print(f"{name:<22} {statistics.median(values):>8.2f} {p90:>8.2f} {max(values):>8.2f}")
    print(f"\nReading an answer of {args.chunks} deltas, {args.rounds} rounds: CPU µs per delta (median)")
    for name, values in cpu.items():
        print(f"{name:<22} {statistics.median(values):>8.1f}")
    print(
        f"\nstart(wait=False) on a kept connection: {ahead:.0f} µs (median), the request written in {written} of "
        f"{args.runs + 1}"
    )
    if old is None:
        print(f"(the old client at {args.old} could not be read from git: left out)")


if __name__ == "__main__":
    main()
