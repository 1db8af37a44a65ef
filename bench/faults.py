"""Benchmark: every fault of issue 37, item 4, injected into Cachet's team layout mid-reply, ``--runs`` times each (10),
on each channel layer (``--layers postgres,redis``): ``kill -9`` and SIGTERM of the worker running a reply, a restart
of a tab's web process, a Postgres outage, a Redis outage, and a message sent during a Redis outage and just after it
(``testing.faults``, which ``tests/faults/test_faults.py`` runs once per layer).

Each layer gets a layout of its own: two web processes (``manage.py serve --no-worker``) and two workers
(``manage.py worker``), started again when they exit as systemd or compose would, on one Postgres reached through a
proxy that is cut for ``--outage`` seconds (2.5), and Redis through another (on the Postgres layer, Redis serves only
Django's cache, ``CACHET_CHANNEL_LAYER=postgres``). Postgres is an embedded one of the run's own unless
``DATABASE_URL`` is set; Redis is a database of ``redis://127.0.0.1:6379`` claimed empty for the run
(``tests.redis_kit``), emptied after. Each run has a fresh session with two tabs (the one sending on web ``k % 2``,
one watching on the other), whose reply streams ``--pieces`` words at 20 a second.

Printed: a table of scenario, layer, runs, lost turns, stuck tabs, dead workers and the recovery time (from the
fault, or from the outage's end, to every tab showing the turn ended and the session idle), p50 and max; the
machine's load before and after; and last ``faults: lost turns = 0, stuck tabs = 0, dead workers = 0``. The exit
status is 1 where any of the three is not 0. ``--verbose`` prints each run's timeline; ``--keep`` leaves the
processes' logs and says where.

    .venv/bin/python bench/faults.py [--runs 10] [--layers postgres,redis] [--scenarios kill-9,sigterm,...]
        [--outage 2.5] [--pieces 50] [--verbose] [--keep]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402


def _load() -> str:
    return Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else str(os.getloadavg())


def _seconds(values: list[float]) -> str:
    if not values:
        return "—"
    ordered = sorted(values)
    return f"{statistics.median(ordered):.2f} / {ordered[-1]:.2f}"


def _setup(scratch: Path) -> None:
    """Django in this process, on the run's own embedded Postgres (or ``DATABASE_URL``), migrated: the tabs' login,
    the sessions and the checks go through it."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    os.environ["CACHET_DATA"] = str(scratch / "harness")
    os.environ["SECRET_KEY"] = "faults-bench-" + secrets.token_hex(24)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def main(argv: list[str] | None = None) -> int:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--layers", default="postgres,redis")
    parser.add_argument("--scenarios", default="", help="comma-separated; all by default")
    parser.add_argument("--outage", type=float, default=2.5, help="seconds Postgres or Redis is cut away")
    parser.add_argument("--pieces", type=int, default=50, help="words of the reply a fault lands in (20 a second)")
    parser.add_argument("--verbose", action="store_true", help="each run's timeline")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="cachet-faults-"))
    scratch.chmod(0o755)  # as root, the embedded Postgres runs as pgserver and must reach its folder
    _setup(scratch)
    from testing.faults import LAYERS, SCENARIOS, Layout, Outcome, Timing
    from tests.redis_kit import claim_database

    layers = [layer for layer in args.layers.split(",") if layer]
    scenarios = [name for name in args.scenarios.split(",") if name] or list(SCENARIOS)
    unknown = [name for name in scenarios if name not in SCENARIOS] + [layer for layer in layers if layer not in LAYERS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)} (scenarios: {', '.join(SCENARIOS)}; layers: {', '.join(LAYERS)})")
    timing = Timing(pieces=args.pieces, fault_after=min(24, args.pieces // 2), outage=args.outage)
    redis: Any = claim_database()
    results: dict[tuple[str, str], list[Outcome]] = {}
    print(f"load before: {_load()}", flush=True)
    started = time.monotonic()
    try:
        for layer in layers:
            redis.empty()
            with Layout(layer, base=scratch / layer, redis_url=redis.url, timing=timing) as layout:
                print(f"{layer}: layout ready in {time.monotonic() - started:.0f} s", flush=True)
                for scenario in scenarios:
                    for number in range(args.runs):
                        outcome = SCENARIOS[scenario](layout)
                        results.setdefault((scenario, layer), []).append(outcome)
                        if args.verbose or not outcome.clean:
                            print(f"  run {number + 1}: {outcome.said()}", flush=True)
                            print(outcome.story(), flush=True)
            redis.empty()
    finally:
        redis.release()
        if args.keep:
            print(f"logs kept in {scratch}")
        else:
            from django.db import connections

            from cachet.embedded_pg import embedded_stop

            connections.close_all()
            embedded_stop(scratch / "harness")  # removed under it, the server ran on
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"load after: {_load()} ({time.monotonic() - started:.0f} s)")
    head = f"{'scenario':<16} {'layer':<9} {'runs':>4} {'lost turns':>10} {'stuck tabs':>10} {'dead workers':>12}"
    print(f"{head} {'recovery p50 / max s':>21} {'next message p50 / max s':>25}")
    lost = stuck = dead = 0
    for (scenario, layer), outcomes in results.items():
        recoveries = [o.recovery for o in outcomes if o.recovery is not None]
        starts = [o.next_start for o in outcomes if o.next_start is not None]
        row = (sum(o.lost for o in outcomes), sum(o.stuck for o in outcomes), sum(o.dead for o in outcomes))
        lost, stuck, dead = lost + row[0], stuck + row[1], dead + row[2]
        print(
            f"{scenario:<16} {layer:<9} {len(outcomes):>4} {row[0]:>10} {row[1]:>10} {row[2]:>12} "
            f"{_seconds(recoveries):>21} {_seconds(starts):>25}"
        )
    print(f"faults: lost turns = {lost}, stuck tabs = {stuck}, dead workers = {dead}")
    return 1 if lost or stuck or dead else 0


if __name__ == "__main__":
    sys.exit(main())
