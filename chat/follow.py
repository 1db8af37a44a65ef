"""A job asked from a terminal (``manage.py ask``): queued as a tab queues one, and followed through the channel
layer.

Where a worker is alive (``manage.py worker``, or the one ``serve`` starts), the job goes to the queue the workers
take jobs from; the worker sends the terminal its lines (:mod:`chat.agent.echo`) and, last, how it ended, while
every open tab of the session follows the reply as well, and a Stop from any of them stops it. Where none is, the
terminal's own process runs a worker for this one job (on a queue of the job's own, so it takes nobody else's):
scripts and CI need no server, and the tabs follow all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from procrastinate.contrib.django import app

from chat.agent.echo import EchoLine
from chat.web import jobs
from chat.web.publisher import ECHO
from chat.worker import process as worker
from sessions_app.errors import ReplyInProgress

ASK_APPLICATION = "cachet-ask"  # the application_name of a terminal's own worker: not a worker others may count on
WATCH_SECONDS = 1.0  # how often the terminal looks whether its job is still in the queue, between messages
VANISHED_LOOKS = 3  # looks at a job gone from the queue without its end reaching the terminal: it will not come
QUEUED_NOTICE_SECONDS = 2.0
WORKER_STOPPED = "The worker running it stopped; the turn is marked interrupted with what it had streamed."


@dataclass
class Followed:
    """How a followed job ended."""

    failure: str = ""
    request_ids: list[int] = field(default_factory=list)
    turn_id: int | None = None  # the turn it started or ended last
    stopped: bool = False  # Ctrl-C asked it to stop
    heard_end: bool = False  # its end reached the terminal (else its worker died, or it was taken out of the queue)


def _queued_state(job_id: int) -> str | None:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return ProcrastinateJob.objects.filter(pk=job_id).values_list("status", flat=True).first()


async def follow(session_id: int, action: jobs.Action, *, write: Callable[[EchoLine], None]) -> Followed:
    """Queue ``action`` for the session and follow it to its end, each of its lines given to ``write``; Ctrl-C
    stops it (a second one stops waiting for it)."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    channel = await layer.new_channel()
    here = not await sync_to_async(worker.worker_alive)()
    queue = f"ask-{uuid.uuid4().hex}" if here else jobs.QUEUE
    application = ASK_APPLICATION if here else f"{ASK_APPLICATION}-defer"
    connector = await sync_to_async(worker.queue_connector)(application_name=application)
    async with worker.queue_open(connector):
        if await sync_to_async(jobs.busy)(session_id):
            return Followed(failure=str(ReplyInProgress()))
        job_id = await jobs.start(session_id, action, reply_to=None, echo_to=channel, queue=queue)
        if job_id is None:
            return Followed(failure=str(ReplyInProgress()))
        working = asyncio.create_task(_work_here(queue)) if here else None
        try:
            return await _followed(layer, channel, session_id, job_id, write, working)
        finally:
            if working is not None:
                working.cancel()  # its job has ended (or was never taken): nothing is left for it to do
                with contextlib.suppress(asyncio.CancelledError):
                    await working


async def _work_here(queue: str) -> None:
    """Run this process's own job (the only one of ``queue``), then return."""
    await app.run_worker_async(
        queues=[queue],
        concurrency=1,
        wait=True,
        listen_notify=False,
        fetch_job_polling_interval=0.2,
        abort_job_polling_interval=worker.POLL_SECONDS,
        shutdown_graceful_timeout=worker.SHUTDOWN_SECONDS,
        install_signal_handlers=False,
        delete_jobs="always",
        update_heartbeat_interval=worker.HEARTBEAT_SECONDS,
        stalled_worker_timeout=worker.STALLED_SECONDS,
    )


async def _followed(
    layer: BaseChannelLayer,
    channel: str,
    session_id: int,
    job_id: int,
    write: Callable[[EchoLine], None],
    working: asyncio.Task[None] | None,
) -> Followed:
    followed = Followed()
    event_loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()

    def on_interrupt() -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread: no Ctrl-C
        event_loop.add_signal_handler(signal.SIGINT, on_interrupt)
    receiving = asyncio.ensure_future(layer.receive(channel))
    interrupt = asyncio.ensure_future(interrupted.wait())
    stopping: asyncio.Task[None] | None = None
    heard = told_queued = False
    vanished = 0
    waited = 0.0
    try:
        while True:
            done, _ = await asyncio.wait(
                {receiving, interrupt}, timeout=WATCH_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            if interrupt in done and stopping is None:
                followed.stopped = True
                stopping = asyncio.create_task(jobs.stop(session_id))
            if receiving in done:
                message = receiving.result()
                receiving = asyncio.ensure_future(layer.receive(channel))
                heard = True
                if message.get("type") == ECHO:
                    for line in message.get("lines", []):
                        write(line)
                elif message.get("type") == jobs.TURN:
                    followed.turn_id = int(message["turn_id"])
                elif message.get("type") == jobs.ENDED:
                    followed.heard_end = True
                    followed.failure = str(message.get("failure") or "")
                    followed.request_ids = [int(pk) for pk in message.get("request_ids", [])]
                    turn_id = message.get("turn_id")
                    if turn_id is not None:
                        followed.turn_id = int(turn_id)
                    return followed
            if done:
                continue
            waited += WATCH_SECONDS
            state = await sync_to_async(_queued_state)(job_id)
            if state is None:
                vanished += 1
                if vanished >= VANISHED_LOOKS:  # taken out before it ran, or its worker died
                    followed.failure = jobs.STOPPED_WAITING if followed.stopped and not heard else WORKER_STOPPED
                    return followed
                continue
            vanished = 0
            if state == "todo" and not heard and not told_queued and waited >= QUEUED_NOTICE_SECONDS:
                told_queued = True
                write({"err": True, "text": jobs.QUEUED, "ending": "\n"})
            if working is not None and working.done():
                working.result()  # the terminal's own worker stopped before its job ended: say why
                raise RuntimeError("the worker of this terminal stopped before its job ended")
    finally:
        receiving.cancel()
        interrupt.cancel()
        if stopping is not None:
            with contextlib.suppress(Exception):
                await stopping
        with contextlib.suppress(Exception):
            event_loop.remove_signal_handler(signal.SIGINT)
