"""A worker process (``manage.py worker``): runs the task queue's jobs (replies, undo, rewind, compaction) on this
machine, and notices the replies of workers that died.

Jobs come from Postgres (Procrastinate: LISTEN/NOTIFY wakes the worker at once, and it polls every few seconds in
case a notification was lost); at most ``concurrency`` run at once. Every ``SWEEP_SECONDS`` the worker looks for
turns that are open while no process holds their session's reply lock (the process running them died, and its
database connection with the lock): it marks them interrupted, keeping the text their reply had streamed as last
saved, and tells every tab of the session. The queue's rows of the jobs a dead worker held (its heartbeat
stopped ``STALLED_SECONDS`` ago) are failed, so the next job of their sessions may run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connection
from procrastinate import PsycopgConnector
from procrastinate.contrib.django import app
from procrastinate.contrib.django.utils import connector_params
from procrastinate.jobs import Status

from chat.web import fragments
from chat.web.display import single_turn
from chat.web.jobs import QUEUE
from chat.web.messages import Put, pack
from chat.web.publisher import MESSAGE_TYPE, session_group
from sessions_app.models import Turn, TurnStatus
from sessions_app.services.locks import orphans_interrupt

logger = logging.getLogger(__name__)

SWEEP_SECONDS = 2.0
POLL_SECONDS = 2.0  # a job whose notification was lost waits at most this long
SHUTDOWN_SECONDS = 10.0  # a stopping worker lets running replies end this long, then stops them
HEARTBEAT_SECONDS = 2.0
STALLED_SECONDS = 6.0  # a worker silent this long is dead: its jobs are failed, its sessions' next jobs go on
OWN_CONNECTIONS = 8  # a worker's own: the queue's pool, the channel layer's, the sweep's, and some to spare
WORKER_APPLICATION = "cachet-worker"  # the application_name of a worker's connections to Postgres


@dataclass(frozen=True)
class Ended:
    """A session whose reply a dead process left, and what its tabs are sent."""

    session_id: int
    texts: list[str]


def _ended(session_ids: set[int]) -> list[Ended]:
    ended = []
    for session_id in sorted(session_ids):
        ops: list[Put] = [fragments.controls_put(running=False)]
        revision = None
        turn = Turn.objects.filter(session_id=session_id, status=TurnStatus.INTERRUPTED).order_by("-pk").first()
        if turn is not None:
            ops.insert(0, fragments.turn_put(single_turn(turn, running=False)))
            revision = turn.revision
        ended.append(Ended(session_id, pack(ops, rev=revision)))
    return ended


def sweep() -> list[Ended]:
    """Mark interrupted the open turns no process replies to; what each of their sessions' tabs is sent."""
    close_old_connections()
    try:
        return _ended(orphans_interrupt())
    finally:
        connection.close()


async def _sweeping() -> None:
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    failing = False
    while True:
        try:
            for stalled in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_SECONDS):
                logger.warning("job %s (%s) of a worker that stopped: failed", stalled.id, stalled.lock)
                await app.job_manager.finish_job(stalled, status=Status.FAILED, delete_job=True)
            for ended in await asyncio.to_thread(sweep):
                logger.warning("session %s: marked interrupted the reply of a process that stopped", ended.session_id)
                for text in ended.texts:
                    await layer.group_send(session_group(ended.session_id), {"type": MESSAGE_TYPE, "text": text})
            if failing:
                logger.warning("looking for the replies of stopped processes works again")
            failing = False
        except Exception as error:
            if not failing:  # once an outage, not every sweep of it
                logger.warning("could not look for the replies of stopped processes: %s", error, exc_info=True)
            failing = True
        await asyncio.sleep(SWEEP_SECONDS)


def queue_connector(*, application_name: str = WORKER_APPLICATION) -> PsycopgConnector:
    """The queue's connection pool for this process, to the database Django uses (started where embedded). Its
    connections carry ``application_name``: those of a worker (the default) say that a worker is alive."""
    connection.ensure_connection()  # starts the embedded Postgres where it is the one
    params = connector_params()
    connection.close()
    return PsycopgConnector(kwargs={**params, "application_name": application_name}, min_size=1, max_size=4)


def connection_room() -> int:
    """How many more connections Postgres accepts now (each reply a worker runs holds one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def concurrency_within(asked: int, *, room: int) -> int:
    """The replies a worker may run at once when Postgres has ``room`` connections left: beyond them, replies
    would fail for want of one ("too many clients")."""
    return max(1, min(asked, room - OWN_CONNECTIONS))


def worker_alive() -> bool:
    """Whether a worker of this database is running (its connections are open): a job queued now gets run."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database())",
            [WORKER_APPLICATION],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


@contextlib.asynccontextmanager
async def queue_open(connector: PsycopgConnector) -> AsyncIterator[None]:
    """The queue's app on ``connector``, open for as long as the block runs."""
    with app.replace_connector(connector):
        async with app.open_async():
            yield


async def work(*, concurrency: int | None = None, install_signal_handlers: bool = True) -> None:
    """Run jobs until stopped (SIGINT or SIGTERM, or the task cancelled), sweeping meanwhile; the caller has
    opened the queue (:func:`queue_open`)."""
    sweeping = asyncio.create_task(_sweeping())
    try:
        await app.run_worker_async(
            queues=[QUEUE],
            concurrency=concurrency or settings.CACHET_WORKER_CONCURRENCY,
            wait=True,
            listen_notify=True,
            fetch_job_polling_interval=POLL_SECONDS,
            abort_job_polling_interval=POLL_SECONDS,
            shutdown_graceful_timeout=SHUTDOWN_SECONDS,
            install_signal_handlers=install_signal_handlers,
            delete_jobs="always",
            update_heartbeat_interval=HEARTBEAT_SECONDS,
            stalled_worker_timeout=STALLED_SECONDS,
        )
    finally:
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping
