"""``manage.py worker``: run replies, undo, rewind and compaction from the task queue, on any machine that
reaches Cachet's Postgres (``chat.worker.process``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chat.worker import process as worker

STOP_LIMIT_SECONDS = 15.0  # a stopping worker exits within this, before ``serve`` (20 s) or Docker (30 s) kills it


class Command(BaseCommand):
    help = "Run the replies (and undo, rewind, compaction) that tabs and `ask` queue, until stopped (Ctrl-C)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=settings.CACHET_WORKER_CONCURRENCY,
            help="replies run at once (CACHET_WORKER_CONCURRENCY)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency = max(1, int(options["concurrency"]))
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C until the worker runs
        try:
            unapplied = MigrationExecutor(connection).migration_plan(
                MigrationExecutor(connection).loader.graph.leaf_nodes()
            )
            if unapplied:
                raise CommandError(
                    f"The database lacks {len(unapplied)} migration(s): run manage.py migrate (serve does) first."
                )
            room = worker.connection_room()
            allowed = worker.concurrency_within(concurrency, room=room)
            if allowed < concurrency:
                self.stdout.write(
                    f"Postgres has room for {room} more connections: this worker runs at most {allowed} replies at "
                    f"once, not {concurrency} (raise Postgres's max_connections to run more)."
                )
                concurrency = allowed
            connector = worker.queue_connector()
            asyncio.run(self._work(connector, concurrency))
        except KeyboardInterrupt:
            pass
        self.stdout.write("Worker stopped.")
        self.stdout.flush()

    def _stop_within(self, seconds: float) -> None:
        """Exit once ``seconds`` have passed since the stop was asked, whatever still runs (under heavy load, a
        database call of the sweep once kept the process waiting past the 20 s that ``serve`` gives it): the
        replies it leaves are marked interrupted by the next worker's sweep."""
        time.sleep(seconds)
        self.stdout.write(f"Worker stopped. Not everything had ended within {seconds:g} s; the sweep marks it.")
        self.stdout.flush()
        os._exit(0)

    async def _work(self, connector: Any, concurrency: int) -> None:
        """Run jobs until SIGINT or SIGTERM, which let running replies end (10 s at most), then stop them."""
        event_loop = asyncio.get_running_loop()
        async with worker.queue_open(connector):
            working = asyncio.create_task(worker.work(concurrency=concurrency, install_signal_handlers=False))

            def stop() -> None:
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
