"""``manage.py worker``: run replies, undo, rewind and compaction from the task queue, on any machine that
reaches Cachet's Postgres (``chat.worker.process``). It waits for Postgres (and for its migrations) rather than
exiting, and stops only when told: SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import threading
import time
from typing import Any

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection
from procrastinate import PsycopgConnector

from chat.management.database import unapplied_migrations
from chat.worker import process as worker
from chat.worker.quiet import database_unavailable

STOP_LIMIT_SECONDS = 15.0  # a stopping worker exits within this, before ``serve`` (20 s) or Docker (30 s) kills it
SUPERVISOR_ENV = "CACHET_SUPERVISOR_PID"  # set by ``serve`` for the workers it starts: the pid of ``serve``
PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal for this process when its parent dies
MIGRATIONS_POLL_SECONDS = 2.0  # a worker started before the database is migrated looks again this often


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # serve runs the checks; a worker starts 0.4 s sooner without the URLconf
    help = "Run the replies (and undo, rewind, compaction) that tabs and `ask` queue, until stopped (Ctrl-C)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=settings.CACHET_WORKER_CONCURRENCY,
            help="replies run at once (CACHET_WORKER_CONCURRENCY)",
        )

    told = False  # SIGINT or SIGTERM came: nothing starts again

    def handle(self, *args: Any, **options: Any) -> None:
        outage = worker.Outage()
        _stop_with_supervisor()
        try:
            while True:
                signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C until the worker runs
                try:
                    connector, concurrency = self._prepared(max(1, int(options["concurrency"])))
                    # uvloop (libuv's loop, as uvicorn runs on): each streamed piece costs the worker about a
                    # tenth less CPU than on asyncio's own loop (bench/web.py, 50 replies streaming).
                    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                        runner.run(self._work(connector, concurrency, outage))
                    break
                except Exception as error:  # Postgres is away at the start: the worker waits for it
                    if self.told or not database_unavailable(error):
                        raise
                    outage.away(error)
                    connection.close()
                    time.sleep(worker.RETRY_SECONDS[-1])
        except KeyboardInterrupt:
            pass
        self.stdout.write("Worker stopped.")
        self.stdout.flush()

    def _prepared(self, concurrency: int) -> tuple[PsycopgConnector, int]:
        """The queue's connector and the replies this worker runs at once, once the database is migrated."""
        waited = False
        while unapplied := unapplied_migrations():
            if not waited:
                self.stdout.write(
                    f"The database lacks {unapplied} migration(s): waiting for them (manage.py serve, or "
                    "manage.py migrate, applies them)."
                )
                self.stdout.flush()
                waited = True
            time.sleep(MIGRATIONS_POLL_SECONDS)
        room = worker.connection_room()
        allowed = worker.concurrency_within(concurrency, room=room)
        if allowed < concurrency:
            self.stdout.write(
                f"Postgres has room for {room} more connections: this worker runs at most {allowed} replies at "
                f"once, not {concurrency} (raise Postgres's max_connections to run more)."
            )
        return worker.queue_connector(), allowed

    def _stop_within(self, seconds: float) -> None:
        """Exit once ``seconds`` have passed since the stop was asked, whatever still runs (under heavy load, a
        database call of the sweep once kept the process waiting past the 20 s that ``serve`` gives it): the
        replies it leaves are marked interrupted by the next worker's sweep."""
        time.sleep(seconds)
        self.stdout.write(f"Worker stopped. Not everything had ended within {seconds:g} s; the sweep marks it.")
        self.stdout.flush()
        os._exit(0)

    async def _work(self, connector: PsycopgConnector, concurrency: int, outage: worker.Outage) -> None:
        """Run jobs until SIGINT or SIGTERM, which let running replies end (10 s at most), then stop them."""
        event_loop = asyncio.get_running_loop()
        async with worker.queue_open(connector):
            outage.back()
            working = asyncio.create_task(
                worker.work(concurrency=concurrency, install_signal_handlers=False, outage=outage)
            )

            def stop() -> None:
                self.told = True
                self.stdout.write("Worker stopping: running replies get 10 s to end.")
                self.stdout.flush()
                working.cancel()
                threading.Thread(target=self._stop_within, args=(STOP_LIMIT_SECONDS,), daemon=True).start()

            for stop_signal in (signal.SIGINT, signal.SIGTERM):
                event_loop.add_signal_handler(stop_signal, stop)
            self.stdout.write(f"Worker ready: runs up to {concurrency} replies at once.")
            self.stdout.flush()
            with contextlib.suppress(asyncio.CancelledError):
                await working


def _stop_with_supervisor() -> None:
    """A worker that ``serve`` started is sent SIGTERM should ``serve`` die without stopping it (killed): it takes no
    job for a server that is gone."""
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if not supervisor:
        return
    with contextlib.suppress(OSError, AttributeError):  # not Linux: serve stops its workers itself
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(supervisor):  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)
