"""Benchmark: the channel layer alone, between two real processes, as replies stream to tabs.

A "web" process opens ``--sessions`` channels, each in its session's group as a tab's consumer is; a
"worker" process streams to every session at once ``--pieces`` messages of about ``--size`` bytes at
``--rate`` a second (the relay's coalesced batches: one message per 50 ms), each ``group_send`` awaited in
turn as the relay does. Printed per layer: relay latency (from the worker's send to the web process's receive,
both on the machine's monotonic clock) p50/p99/max, messages lost, and each process's CPU over the run.

Layers: ``postgres`` (``cachet.pg_layer``), ``channels_postgres`` (version 1.1.4 from PyPI, not a dependency:
``pip install --target DIR`` it and put DIR on ``PYTHONPATH``), ``redis`` (channels_redis core, as the settings
made it before), ``pubsub`` (channels_redis pub/sub) and ``cachet_pubsub`` (``cachet.redis_layer``, what the
settings make with ``REDIS_URL``). Postgres is an embedded one of the run's own unless ``DATABASE_URL`` is set. Redis
runs on a database of ``redis://127.0.0.1:6379`` claimed empty for the run (``tests.redis_kit``), emptied
after.

    .venv/bin/python bench/layer_bench.py [--layers postgres,redis,pubsub,cachet_pubsub]
        [--sessions 50] [--pieces 100] [--one-process] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")


def make_layer(name: str, redis_url: str) -> Any:
    import django

    django.setup()
    from django.conf import settings

    if name == "postgres":
        from cachet.pg_layer import PostgresChannelLayer

        return PostgresChannelLayer(capacity=5000)
    if name == "channels_postgres":
        from django.db import connection

        theirs = importlib.import_module("channels_postgres.core").PostgresChannelLayer
        params = connection.get_connection_params()
        database = {"NAME": params["dbname"], "USER": params.get("user", ""), "PASSWORD": params.get("password", "")}
        return theirs(**database, HOST=params.get("host", ""), PORT=str(params.get("port", "")), TIME_ZONE=None)
    host = {"address": redis_url, "socket_timeout": 30.0}
    if name == "redis":
        from channels_redis.core import RedisChannelLayer

        return RedisChannelLayer(hosts=[host], capacity=5000, expiry=120)
    if name == "pubsub":
        from channels_redis.pubsub import RedisPubSubChannelLayer

        return RedisPubSubChannelLayer(hosts=[host])
    if name == "cachet_pubsub":
        from cachet.redis_layer import RedisPubSubLayer, channel_prefix

        return RedisPubSubLayer(
            hosts=[{"address": redis_url, "socket_timeout": settings.REDIS_SOCKET_TIMEOUT}],
            prefix=channel_prefix(redis_url),
        )
    raise SystemExit(f"unknown layer {name}")


def body(size: int, session: int, piece: int) -> str:
    head = json.dumps({"t": time.monotonic(), "s": session, "p": piece}, separators=(",", ":"))
    return head + " " + "x" * max(0, size - len(head) - 1)


async def web(layer: Any, sessions: int, pieces: int, ready: Any, timeout: float) -> dict[str, Any]:
    """Receive every session's messages; the latency of each."""
    channels = []
    for session in range(sessions):
        channel = await layer.new_channel()
        await layer.group_add(f"session-{session}", channel)
        channels.append(channel)
    ready()
    latencies: list[float] = []
    started_cpu, started = time.process_time(), time.monotonic()
    first: list[float] = []

    async def tab(channel: str) -> None:
        for _ in range(pieces):
            message = await layer.receive(channel)
            sent = json.loads(message["text"].split(" ", 1)[0])["t"]
            now = time.monotonic()
            if not first:
                first.append(now)
            latencies.append(now - sent)

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(tab(channel) for channel in channels)), timeout)
    cpu = time.process_time() - started_cpu
    return {"latencies": latencies, "cpu": cpu, "wall": time.monotonic() - (first[0] if first else started)}


async def worker(layer: Any, sessions: int, pieces: int, rate: float, size: int) -> dict[str, Any]:
    """Stream to every session at once, each send awaited as the relay awaits it."""
    started_cpu = time.process_time()
    errors = 0

    async def stream(session: int) -> None:
        nonlocal errors
        start = time.monotonic() + session * (1 / rate) / sessions  # sessions spread over one period
        for piece in range(pieces):
            await asyncio.sleep(max(0.0, start + piece / rate - time.monotonic()))
            try:
                await layer.group_send(
                    f"session-{session}", {"type": "cachet.message", "text": body(size, session, piece)}
                )
            except Exception:
                errors += 1

    await asyncio.gather(*(stream(session) for session in range(sessions)))
    return {"cpu": time.process_time() - started_cpu, "errors": errors}


def child(args: argparse.Namespace) -> None:
    layer = make_layer(args.layer, args.redis)

    async def run() -> dict[str, Any]:
        if args.role == "web":
            result = await web(layer, args.sessions, args.pieces, lambda: print("ready", flush=True), args.timeout)
        elif args.role == "worker":
            sys.stdin.readline()
            result = await worker(layer, args.sessions, args.pieces, args.rate, args.size)
        else:  # both, in one process
            tabs = asyncio.create_task(web(layer, args.sessions, args.pieces, lambda: None, args.timeout))
            await asyncio.sleep(0.5)
            sent = await worker(layer, args.sessions, args.pieces, args.rate, args.size)
            result = await tabs
            result["errors"] = sent["errors"]
        for closing in ("close", "close_pools"):
            if hasattr(layer, closing):
                await getattr(layer, closing)()
        return result

    print("result " + json.dumps(asyncio.run(run())), flush=True)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure(layer: str, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    base = [sys.executable, __file__, "--child", "--layer", layer, "--redis", redis_url]
    base += ["--sessions", str(args.sessions), "--pieces", str(args.pieces), "--rate", str(args.rate)]
    base += ["--size", str(args.size), "--timeout", str(args.timeout)]
    if args.one_process:
        done = subprocess.run([*base, "--role", "both"], capture_output=True, text=True, check=True)
        got = json.loads(done.stdout.split("result ", 1)[1])
        return {**got, "worker_cpu": 0.0}
    web_process = subprocess.Popen([*base, "--role", "web"], stdout=subprocess.PIPE, text=True)
    assert web_process.stdout is not None
    while (line := web_process.stdout.readline()) and not line.startswith("ready"):
        pass
    worker_process = subprocess.Popen(
        [*base, "--role", "worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)  # the worker's imports and connection, before the clock starts
    worker_out, _ = worker_process.communicate("go\n")
    web_out = web_process.stdout.read()
    web_process.wait()
    got = json.loads(web_out.split("result ", 1)[1])
    sent = json.loads(worker_out.split("result ", 1)[1])
    return {**got, "worker_cpu": sent["cpu"], "errors": sent["errors"]}


def prepare_database(scratch: Path, *, with_theirs: bool) -> None:
    """Without ``DATABASE_URL``, an embedded Postgres of the run's own (in ``scratch``); the layer's table, and
    channels_postgres' tables and app where it is measured."""
    if not os.environ.get("DATABASE_URL"):
        os.environ["CACHET_DATA"] = str(scratch / "data")
    apps = ["cachet"]
    if with_theirs:
        (scratch / "layer_bench_settings.py").write_text(
            "from cachet.settings import *  # noqa: F403\n\n"
            'INSTALLED_APPS = [*INSTALLED_APPS, "channels_postgres"]  # noqa: F405\n'
        )
        os.environ["PYTHONPATH"] = os.pathsep.join([str(scratch), os.environ.get("PYTHONPATH", "")])
        os.environ["DJANGO_SETTINGS_MODULE"] = "layer_bench_settings"
        apps.append("channels_postgres")
    for app in apps:
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0", app], check=True)


def main() -> None:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--layers", default="postgres,redis,pubsub,cachet_pubsub")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--pieces", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="messages a second per session")
    parser.add_argument("--size", type=int, default=400, help="bytes per message")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--one-process", action="store_true", help="both roles in one process for every layer")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="both", help=argparse.SUPPRESS)
    parser.add_argument("--layer", default="postgres", help=argparse.SUPPRESS)
    parser.add_argument("--redis", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    layers = [name for name in args.layers.split(",") if name]
    scratch = tempfile.TemporaryDirectory(prefix="cachet-layer-bench-")
    prepare_database(Path(scratch.name), with_theirs="channels_postgres" in layers)
    database = None
    redis_url = ""
    if {"redis", "pubsub", "cachet_pubsub"} & set(layers):
        from tests.redis_kit import claim_database

        database = claim_database()
        redis_url = database.url
    try:
        rate = f"{args.rate:g}/s"
        print(
            f"{args.sessions} sessions × {args.pieces} messages of {args.size} B at {rate} each; {os.cpu_count()} cores"
        )
        print(f"{'layer':<18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'lost':>6} {'web CPU s':>10}", end="")
        print(f" {'worker CPU s':>13}")
        for layer in layers:
            for _ in range(args.repeat):
                got = measure(layer, args, redis_url)
                if database is not None:
                    database.empty()
                latencies = [value * 1000 for value in got["latencies"]]
                lost = args.sessions * args.pieces - len(latencies)
                print(
                    f"{layer:<18} {statistics.median(latencies):>8.1f} {_pct(latencies, 0.99):>8.1f} "
                    f"{max(latencies):>8.1f} {lost:>6} {got['cpu']:>10.2f} {got['worker_cpu']:>13.2f}"
                    + (f"  ({got['errors']} send errors)" if got.get("errors") else ""),
                    flush=True,
                )
        print("load:", os.getloadavg())
    finally:
        if database is not None:
            database.release()
        scratch.cleanup()


if __name__ == "__main__":
    main()
