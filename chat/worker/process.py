"""A worker process (``manage.py worker``): runs the task queue's jobs (replies, undo, rewind, compaction) on this
machine, and notices the replies of workers that died.

Jobs come from Postgres (Procrastinate: LISTEN/NOTIFY wakes the worker at once, and it polls every few seconds in
case a notification was lost); at most ``concurrency`` run at once. Every ``SWEEP_SECONDS`` the worker looks for
turns that are open while no process holds their session's reply lock (the process running them died, and its
database connection with the lock): it marks them interrupted, keeping the text their reply had streamed as last
saved, tells every tab of the session, and fails the queue's row of the dead process's job at once, so the
session's next job runs now rather than once the dead worker's heartbeat is ``STALLED_SECONDS`` old (the rows of
a dead worker's other jobs are failed then).

An outage of Postgres never ends a worker: the queue, its LISTEN and the sweep fail fast while it lasts, the worker
waits for Postgres to answer again (trying every second at most) and goes on, and its log says once that the
outage began and once that it ended. Only SIGINT or SIGTERM (or the task cancelled) stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from django.conf import settings
from django.db import close_old_connections, connection
from procrastinate import PsycopgConnector
from procrastinate.contrib.django import app
from procrastinate.contrib.django.utils import connector_params
from procrastinate.jobs import Status
from procrastinate.manager import get_channel_for_queues

from chat import wire
from chat.actions import CHECKS_QUEUE, QUEUE, session_key
from chat.worker.publish import publish
from chat.worker.quiet import database_unavailable
from sessions_app.models import Turn, TurnStatus
from sessions_app.services.locks import LOCK_NAMESPACE, orphans_interrupt

logger = logging.getLogger(__name__)

SWEEP_SECONDS = 0.5  # a dead worker's turn is marked interrupted, and its session free, within this (and a sweep)
POLL_SECONDS = 2.0  # a job whose notification was lost waits at most this long
SHUTDOWN_SECONDS = 10.0  # a stopping worker lets running replies end this long, then stops them
HEARTBEAT_SECONDS = 2.0
STALLED_SECONDS = 6.0  # a worker silent this long is dead: its jobs are failed, its sessions' next jobs go on
OWN_CONNECTIONS = 8  # a worker's own: the queue's pool, the channel layer's, the sweep's, and some to spare
WORKER_APPLICATION = "cachet-worker"  # the application_name of a worker's connections to Postgres
POOL_WAIT_SECONDS = 5.0  # a call of the queue waits this long for a connection, then fails (Postgres is away)
CONNECT_SECONDS = 5  # a connection that Postgres does not answer (its machine gone) is given up after this
RETRY_SECONDS = (0.25, 0.5, 1.0)  # between tries while Postgres is away; the last one repeats
RESTART_SECONDS = 10.0  # the queue's worker that ends sooner after its start waits a second before the next
# The sweep's look, and the look for Postgres after an outage, wait this long for the queue's pool and then look
# again. The pool gives up connecting at once while Postgres is away (``reconnect_timeout=0``) and makes no new try
# for a call already waiting: a call begun during an outage waited its whole POOL_WAIT_SECONDS, so a turn the outage
# left open was marked interrupted 3 s after a 2.5 s outage ended, 5 s after a long one. A new call tries at once.
LOOK_SECONDS = 1.0


class Outage:
    """Whether this process finds Postgres away, told once when it goes and once when it is back, whoever of the
    queue and the sweep notices."""

    def __init__(self) -> None:
        self.since: float | None = None

    def away(self, error: BaseException) -> None:
        if self.since is None:
            self.since = time.monotonic()
            logger.warning("Postgres is out of reach (%s); the worker waits for it and goes on then", _said(error))

    def back(self) -> None:
        if self.since is not None:
            logger.warning("Postgres answers again after %.0f s; the worker goes on", time.monotonic() - self.since)
            self.since = None


def _said(error: BaseException) -> str:
    """The error in one line, its cause's words where it only wraps one (the queue's ``ConnectorException``)."""
    while not str(error).strip() and error.__cause__ is not None:
        error = error.__cause__
    return " ".join(str(error).split()) or type(error).__name__


@dataclass(frozen=True)
class Ended:
    """A session whose reply a dead process left, the turn it left (id and revision, as marked interrupted), and
    the queue's rows of its job."""

    session_id: int
    turn: tuple[int, int] | None
    jobs: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)  # the turn's requests to the model, as the job would have said


def _ended(session_ids: set[int]) -> list[Ended]:
    from procrastinate.contrib.django.models import ProcrastinateJob

    ended = []
    for session_id in sorted(session_ids):
        turn = Turn.objects.filter(session_id=session_id, status=TurnStatus.INTERRUPTED).order_by("-pk").first()
        rows = ProcrastinateJob.objects.filter(lock=session_key(session_id), status="doing")
        left = (turn.pk, turn.revision) if turn is not None else None
        requests = sorted(turn.requests.values_list("id", flat=True)) if turn is not None else []
        ended.append(Ended(session_id, left, sorted(rows.values_list("id", flat=True)), requests))
    return ended


def sweep() -> list[Ended]:
    """Mark interrupted the open turns no process replies to; what each of their sessions' tabs is sent, and the
    queue's rows of the jobs that left them (their process died: no other job of the session can run meanwhile)."""
    close_old_connections()
    try:
        return _ended(orphans_interrupt())
    finally:
        connection.close()


async def _retire(job_ids: list[int]) -> None:
    """Fail the queue's rows of dead jobs, and wake the workers: the next job of their sessions may run now."""
    for job_id in job_ids:
        with contextlib.suppress(Exception):  # it ended meanwhile (its process was not dead after all)
            await app.job_manager.finish_job_by_id_async(job_id, status=Status.FAILED, delete_job=True)
            logger.warning("job %s of a process that stopped: failed", job_id)
    if job_ids:
        payload = json.dumps({"type": "job_inserted", "job_id": None})
        for channel in [*get_channel_for_queues(queues=[QUEUE, CHECKS_QUEUE]), *get_channel_for_queues()]:
            await app.connector.execute_query_async(
                "SELECT pg_notify(%(channel)s, %(payload)s)", channel=channel, payload=payload
            )


_ORPHANS = f"""
SELECT EXISTS (
  SELECT 1 FROM {Turn._meta.db_table} turn WHERE turn.status = %(open)s AND NOT EXISTS (
    SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %(namespace)s AND objsubid = 2
      AND objid = turn.session_id AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  )
) AS orphans
"""


async def _orphans() -> bool:
    """Whether some open turn has no process replying to it: one query on the queue's pool, so that looking twice a
    second costs no connection (the sweep itself runs in a thread, on Django's); ``TimeoutError`` where the pool
    has no connection for it within ``LOOK_SECONDS`` (Postgres is away)."""
    async with asyncio.timeout(LOOK_SECONDS):
        row = await app.connector.execute_query_one_async(_ORPHANS, open=TurnStatus.OPEN, namespace=LOCK_NAMESPACE)
    return bool(row["orphans"])


async def _sweep_once() -> None:
    for ended in await asyncio.to_thread(sweep) if await _orphans() else []:
        logger.warning("session %s: marked interrupted the reply of a process that stopped", ended.session_id)
        await _retire(ended.jobs)
        if ended.turn is not None:
            turn_id, revision = ended.turn
            await publish(wire.turn_ended_message(ended.session_id, turn=turn_id, revision=revision))
        await publish(wire.job_message(ended.session_id, state="idle"))
        for job_id in ended.jobs:
            failure = "The worker running it stopped; the turn is marked interrupted with what it had streamed."
            turn = ended.turn[0] if ended.turn is not None else None
            message = wire.job_ended_message(
                ended.session_id, job=job_id, failure=failure, requests=ended.requests, turn=turn
            )
            await publish(message)
    for stalled in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_SECONDS):
        logger.warning("job %s (%s) of a worker that stopped: failed", stalled.id, stalled.lock)
        await app.job_manager.finish_job(stalled, status=Status.FAILED, delete_job=True)


async def _sweeping(outage: Outage) -> None:
    while True:
        try:
            await _sweep_once()
        except Exception as error:
            if not database_unavailable(error):
                logger.exception("could not look for the replies of stopped processes")
            outage.away(error)
        else:
            outage.back()
        await asyncio.sleep(SWEEP_SECONDS)


def queue_connector(*, application_name: str = WORKER_APPLICATION) -> PsycopgConnector:
    """The queue's connection pool for this process, to the database Django uses (started where embedded). Its
    connections carry ``application_name``: those of a worker (the default) say that a worker is alive. While
    Postgres is away, a call waits ``POOL_WAIT_SECONDS`` at most, and each call tries to connect again at once
    (rather than a pool's backoff, which reached 16 s and more after an outage of 20)."""
    connection.ensure_connection()  # starts the embedded Postgres where it is the one
    params = connector_params()
    connection.close()
    params.setdefault("connect_timeout", CONNECT_SECONDS)
    return PsycopgConnector(
        kwargs={**params, "application_name": application_name},
        min_size=1,
        max_size=4,
        timeout=POOL_WAIT_SECONDS,
        reconnect_timeout=0,
    )


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


async def answering(outage: Outage) -> None:
    """Return once the queue's Postgres answers, trying again and again meanwhile (``RETRY_SECONDS``)."""
    tries = 0
    while True:
        try:
            async with asyncio.timeout(LOOK_SECONDS):
                await app.job_manager.check_connection_async()
        except Exception as error:
            if not database_unavailable(error):
                logger.warning("the queue's database answers with an error: %s", _said(error))
            outage.away(error)
        else:
            outage.back()
            return
        await asyncio.sleep(RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)])
        tries += 1


async def _run_queue(concurrency: int, outage: Outage) -> None:
    """Procrastinate's worker, made again whenever it ends untold: an outage ends it (a failed LISTEN or heartbeat
    stops it, a failed fetch raises); its jobs' rows were failed by then or are failed as stalled."""
    while True:
        started = time.monotonic()
        try:
            await app.run_worker_async(
                queues=[QUEUE, CHECKS_QUEUE],
                concurrency=concurrency,
                wait=True,
                listen_notify=True,
                fetch_job_polling_interval=POLL_SECONDS,
                abort_job_polling_interval=POLL_SECONDS,
                shutdown_graceful_timeout=SHUTDOWN_SECONDS,
                install_signal_handlers=False,
                delete_jobs="always",
                update_heartbeat_interval=HEARTBEAT_SECONDS,
                stalled_worker_timeout=STALLED_SECONDS,
            )
        except Exception as error:
            if not database_unavailable(error):
                logger.exception("the queue's worker failed; it starts again")
            outage.away(error)
        if time.monotonic() - started < RESTART_SECONDS:  # whatever ends it at once does not spin
            await asyncio.sleep(RETRY_SECONDS[-1])
        await answering(outage)


def ready_to_work() -> None:
    """What the jobs use, loaded before the first is taken rather than in its first reply: the modules of the
    tasks (``chat.tasks`` imports them when a job runs, so that web processes never do), the model clients'
    transport and their TLS context (reading the CA bundle, about 20 ms of CPU)."""
    import chat.agent.model.aio
    import chat.worker.checks
    import chat.worker.jobs
    import chat.worker.mcp_checks  # noqa: F401
    from chat.agent.model.transport import ssl_context

    ssl_context()


async def work(
    *, concurrency: int | None = None, install_signal_handlers: bool = True, outage: Outage | None = None
) -> None:
    """Run jobs until stopped (SIGINT or SIGTERM, or the task cancelled), sweeping meanwhile, through any outage
    of Postgres (told once, through ``outage``); the caller has opened the queue (:func:`queue_open`)."""
    outage = outage or Outage()
    told = asyncio.Event()
    current = asyncio.current_task()
    assert current is not None
    event_loop = asyncio.get_running_loop()

    def stop() -> None:
        told.set()
        current.cancel()

    signals = (signal.SIGINT, signal.SIGTERM) if install_signal_handlers else ()
    for stop_signal in signals:
        event_loop.add_signal_handler(stop_signal, stop)
    ready_to_work()
    sweeping = asyncio.create_task(_sweeping(outage))
    try:
        await _run_queue(concurrency or settings.CACHET_WORKER_CONCURRENCY, outage)
    except asyncio.CancelledError:
        if not told.is_set():
            raise
    finally:
        for stop_signal in signals:
            event_loop.remove_signal_handler(stop_signal)
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping
