"""A job asked from a terminal (``manage.py ask``): queued as a tab queues one, and followed through the channel
layer.

The terminal joins the session's group as a tab does and hears the same typed events (``chat.wire``); it prints
those of its own job (from the job's ``running`` to its ``job_ended``) as :mod:`chat.agent.echo` says, and what the
job tells the asker comes to its own channel. Where a worker is alive (``manage.py worker``, or the one ``serve``
starts), the job goes to the queue the workers take jobs from, and every open tab of the session follows the reply
as well; a Stop from any of them stops it. Where none is, the terminal's own process runs a worker for this one job
(on a queue of the job's own, so it takes nobody else's, and with its cache checks run by the job itself): scripts
and CI need no server, and the tabs follow all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from procrastinate.contrib.django import app

from chat import wire
from chat.actions import QUEUE, Action
from chat.agent.echo import EchoLine, echo_lines, result_line
from chat.web import queueing
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


def _result_line(result_id: int) -> str:
    from sessions_app.models import Result

    inserted = Result.objects.filter(pk=result_id).values_list("inserted_text", flat=True).first()
    return result_line(inserted or "")


def _queued_state(job_id: int) -> str | None:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return ProcrastinateJob.objects.filter(pk=job_id).values_list("status", flat=True).first()


async def follow(session_id: int, action: Action, *, write: Callable[[EchoLine], None]) -> Followed:
    """Queue ``action`` for the session and follow it to its end, each of its lines given to ``write``; Ctrl-C
    stops it (a second one stops waiting for it)."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    channel = await layer.new_channel()
    await layer.group_add(wire.session_group(session_id), channel)
    try:
        here = not await sync_to_async(worker.worker_alive)()
        queue = f"ask-{uuid.uuid4().hex}" if here else QUEUE
        application = ASK_APPLICATION if here else f"{ASK_APPLICATION}-defer"
        connector = await sync_to_async(worker.queue_connector)(application_name=application)
        async with worker.queue_open(connector):
            if await sync_to_async(queueing.busy)(session_id):
                return Followed(failure=str(ReplyInProgress()))
            queued = await queueing.start(session_id, action, reply_to=channel, queue=queue, checks_queued=not here)
            if queued is None:
                return Followed(failure=str(ReplyInProgress()))
            job_id = queued.job_id
            working = asyncio.create_task(_work_here(queue)) if here else None
            try:
                return await _followed(layer, channel, session_id, job_id, write, working)
            finally:
                if working is not None:
                    working.cancel()  # its job has ended (or was never taken): nothing is left for it to do
                    with contextlib.suppress(asyncio.CancelledError):
                        await working
    finally:
        with contextlib.suppress(Exception):
            await layer.group_discard(wire.session_group(session_id), channel)


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


@dataclass(frozen=True)
class Quiet:
    """No event of the job came for :data:`WATCH_SECONDS`: its state in the queue (``None``: no longer there)."""

    state: str | None


async def job_events(
    layer: BaseChannelLayer, channel: str, job_id: int
) -> AsyncGenerator[Mapping[str, Any] | Quiet, None]:
    """The typed events ``channel`` (a member of the session's group) hears of job ``job_id``, from the job's
    ``running`` to its ``job_ended`` (the last given), with what was sent to ``channel`` alone; a :class:`Quiet`
    for each :data:`WATCH_SECONDS` that nothing came. The caller ends it where the job is gone from the queue."""
    receiving = asyncio.ensure_future(layer.receive(channel))
    heard = False
    try:
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=WATCH_SECONDS)
            if not done:
                yield Quiet(await sync_to_async(_queued_state)(job_id))
                continue
            message = receiving.result()
            receiving = asyncio.ensure_future(layer.receive(channel))
            try:
                event = wire.checked(message)
            except wire.WireError:
                continue
            name = event["event"]
            if name == "job" and event["job"] == job_id and event["state"] == "running":
                heard = True
            if not heard and name not in wire.TO_ONE and name != "job_ended":
                continue  # another job's, before this one ran
            if name == "job_ended" and event["job"] != job_id:
                continue
            yield event
            if name == "job_ended":
                return
    finally:
        receiving.cancel()


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
    stopping: list[asyncio.Task[bool]] = []

    def on_interrupt() -> None:
        if stopping:
            raise KeyboardInterrupt
        followed.stopped = True
        stopping.append(event_loop.create_task(queueing.stop(session_id)))

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread: no Ctrl-C
        event_loop.add_signal_handler(signal.SIGINT, on_interrupt)
    heard = told_queued = False
    vanished = 0
    waited = 0.0
    try:
        async with contextlib.aclosing(job_events(layer, channel, job_id)) as events:
            async for event in events:
                if isinstance(event, Quiet):
                    waited += WATCH_SECONDS
                    if event.state is None:
                        vanished += 1
                        if vanished >= VANISHED_LOOKS:  # taken out before it ran, or its worker died
                            stopped_waiting = followed.stopped and not heard
                            followed.failure = queueing.STOPPED_WAITING if stopped_waiting else WORKER_STOPPED
                            return followed
                        continue
                    vanished = 0
                    if event.state == "todo" and not heard and not told_queued and waited >= QUEUED_NOTICE_SECONDS:
                        told_queued = True
                        write({"err": True, "text": queueing.QUEUED, "ending": "\n"})
                    if working is not None and working.done():
                        working.result()  # the terminal's own worker stopped before its job ended: say why
                        raise RuntimeError("the worker of this terminal stopped before its job ended")
                    continue
                name = event["event"]
                if name == "job" and event["state"] == "running":
                    heard = True
                if name == "turn_started":
                    followed.turn_id = event["turn"]
                elif name == "job_ended":
                    followed.heard_end = True
                    followed.failure = event["failure"]
                    followed.request_ids = list(event["requests"])
                    if event["turn"] is not None:
                        followed.turn_id = event["turn"]
                    return followed
                line = await sync_to_async(_result_line)(event["result"]) if name == "result_stored" else ""
                for echoed in echo_lines(event, result_line=line):
                    write(echoed)
        raise AssertionError("the job's events end with its end")
    finally:
        for task in stopping:
            with contextlib.suppress(Exception):
                await task
        with contextlib.suppress(Exception):
            event_loop.remove_signal_handler(signal.SIGINT)
