"""Benchmark: the CPU a call to a model server's own API costs Cachet's process, with a new httpx client per call
(as ``chat.agent.server_api`` made them before: with its SSL context made once, and before that with the CA
bundle read on every call) and with the process's one shared client (as it does now).

A cache check asks ``/apply-template`` then ``/tokenize`` for every request of a reply; the budget asks them
before a request too. The scripted server answers both in a process of its own, so only the client's CPU is
counted (``time.process_time`` of this process). The two ways alternate in rounds over the same prompt; the
figures are medians of the rounds, per call.

    python bench/server_api_bench.py [--calls 50] [--rounds 5] [--turns 8]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat.agent import server_api  # noqa: E402
from chat.agent.model.transport import close_shared_client, ssl_context  # noqa: E402
from testing.interrupts import sigterm_as_interrupt  # noqa: E402


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "testing.scripted_server", "--port", str(port), "--n-ctx", "1000000"]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return server
        except httpx.HTTPError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("the scripted server did not start")


def _messages(turns: int) -> list[dict[str, Any]]:
    system = "You are Cachet's model. Read the workspace, answer briefly, call tools when they help. " * 40
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: what does module {turn} do? " * 10})
        messages.append({"role": "assistant", "content": f"Module {turn} parses the input and stores it. " * 30})
    messages.append({"role": "user", "content": "And the last one?"})
    return messages


def _new_client_per_call(root: str, path: str, payload: dict[str, Any]) -> Any:
    """The call as ``server_api._call`` made it before: ``httpx.post``, a new client each time."""
    headers = {"Accept": "application/json"}
    return httpx.post(root + path, json=payload, headers=headers, timeout=10.0, verify=ssl_context()).json()


def _new_client_and_context_per_call(root: str, path: str, payload: dict[str, Any]) -> Any:
    """The call as first written: ``httpx.post`` reading the CA bundle for its SSL context every time."""
    return httpx.post(root + path, json=payload, headers={"Accept": "application/json"}, timeout=10.0).json()


def _per_call(calls: int, call: Callable[[], object]) -> tuple[float, float]:
    """CPU and wall milliseconds per call, over ``calls`` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        call()
    return (time.process_time() - cpu) * 1000 / calls, (time.perf_counter() - wall) * 1000 / calls


def main() -> None:
    """Print the CPU and wall time per call of both ways, side by side."""
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()

    port = _free_port()
    server = _serve(port)
    root = f"http://127.0.0.1:{port}"
    base_url = root + "/v1"
    messages = _messages(args.turns)
    prompt = server_api.apply_template(base_url, messages)
    assert prompt is not None, "the scripted server renders"
    ways: dict[str, dict[str, Callable[[], object]]] = {
        "new client+SSL context": {
            "/apply-template": lambda: _new_client_and_context_per_call(
                root, "/apply-template", {"messages": messages}
            ),
            "/tokenize": lambda: _new_client_and_context_per_call(
                root, "/tokenize", {"content": prompt, "add_special": True}
            ),
        },
        "new client per call": {
            "/apply-template": lambda: _new_client_per_call(root, "/apply-template", {"messages": messages}),
            "/tokenize": lambda: _new_client_per_call(root, "/tokenize", {"content": prompt, "add_special": True}),
        },
        "shared client": {
            "/apply-template": lambda: server_api.apply_template(base_url, messages),
            "/tokenize": lambda: server_api.tokenize(base_url, prompt),
        },
    }
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for way, calls in ways.items():
                for path, call in calls.items():
                    figures.setdefault((way, path), []).append(_per_call(args.calls, call))
    finally:
        close_shared_client()
        server.terminate()
        server.wait(10)

    print(
        f"{len(prompt):,} characters of prompt, {args.calls} calls x {args.rounds} rounds, medians per call "
        "(client process only; the server runs apart)"
    )
    print(f"{'call':<16} {'way':<24} {'CPU ms':>8} {'wall ms':>8}")
    for path in ("/apply-template", "/tokenize"):
        for way in ways:
            rounds = figures[(way, path)]
            cpu = statistics.median(r[0] for r in rounds)
            wall = statistics.median(r[1] for r in rounds)
            print(f"{path:<16} {way:<24} {cpu:>8.2f} {wall:>8.2f}")
    for way in ways:
        cpu = sum(statistics.median(r[0] for r in figures[(way, path)]) for path in ("/apply-template", "/tokenize"))
        print(f"{'a cache check':<16} {way:<24} {cpu:>8.2f}")


if __name__ == "__main__":
    main()
