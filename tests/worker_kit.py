"""A worker of the task queue inside the test process, on the event loop of the test (or of the Daphne that the
browser tests run), so it shares the test's in-memory channel layer: what ``manage.py worker`` runs, minus the
process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.db import connection

from chat.worker import process as worker


def forget_jobs() -> None:
    """Delete every job of the queue: its tables are not Django's, so no test's teardown empties them."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")


def _last_worker() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM procrastinate_workers")
        row = cursor.fetchone()
    return int(row[0]) if row else 0


@contextlib.asynccontextmanager
async def running_worker(*, concurrency: int = 8) -> AsyncIterator[None]:
    """Run queued jobs while the block runs (from once the worker has registered); at its end, stop them and
    forget every job of the queue."""
    connector = await sync_to_async(worker.queue_connector)()
    async with worker.queue_open(connector):
        before = await sync_to_async(_last_worker)()
        working = asyncio.create_task(worker.work(concurrency=concurrency, install_signal_handlers=False))
        try:
            async with asyncio.timeout(30):
                while await sync_to_async(_last_worker)() <= before and not working.done():
                    await asyncio.sleep(0.01)
            yield
        finally:
            working.cancel()
            try:
                async with asyncio.timeout(30):
                    with contextlib.suppress(asyncio.CancelledError):
                        await working
            except TimeoutError:
                raise AssertionError("the worker did not stop within 30 s of being cancelled") from None
    await sync_to_async(forget_jobs)()
