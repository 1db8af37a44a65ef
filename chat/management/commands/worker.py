"""``manage.py worker``: run replies, undo, rewind and compaction from the task queue, on any machine that
reaches Cachet's Postgres (``chat.worker``)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from chat import worker


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
        connector = worker.queue_connector()
        self.stdout.write(f"Worker ready: runs up to {concurrency} replies at once.")
        self.stdout.flush()
        asyncio.run(self._work(connector, concurrency))
        self.stdout.write("Worker stopped.")

    @staticmethod
    async def _work(connector: Any, concurrency: int) -> None:
        async with worker.queue_open(connector):
            await worker.work(concurrency=concurrency)
