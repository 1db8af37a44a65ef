"""A session's actions as jobs of the task queue (Procrastinate, on Postgres), as web processes and ``ask`` queue,
stop and watch them; workers run them (``chat.worker.jobs``).

One job of a session runs at a time (the queue's lock on the session) and at most one waits (its queueing lock).
The job belongs to no websocket: the reply goes on when the tab that asked for it closes. Whether a reply runs is
the session's reply lock's to say (the loop holds it); whether one waits or runs is the queue's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from procrastinate import exceptions as queue_errors
from procrastinate.contrib.django import app as queue_app

from chat import wire
from chat.actions import QUEUE, Action, session_key
from chat.web.publish import publish, stop_reply
from chat.web.socket_store import store_call

STOPPED_WAITING = "Stopped before it started; nothing was sent to the model."
QUEUED = "Queued: waiting for a worker…"


def _queued(session_id: int, *statuses: str) -> Any:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return ProcrastinateJob.objects.filter(lock=session_key(session_id), status__in=statuses)


_job_states: OrderedDict[int, str] = OrderedDict()  # the last jobs this process heard of from their worker
KEPT_JOBS = 4096


def job_heard(job_id: int, state: str) -> None:
    """The worker said job ``job_id`` is ``running`` or ``idle`` (this process relays it to its tabs)."""
    _job_states[job_id] = state
    _job_states.move_to_end(job_id)
    while len(_job_states) > KEPT_JOBS:
        _job_states.popitem(last=False)


def job_begun(job_id: int) -> bool:
    """Whether this process heard job ``job_id``'s worker say it runs or has ended."""
    return job_id in _job_states


def busy(session_id: int) -> bool:
    """Whether a job of the session waits in the queue or runs (the reply lock says only the latter). A job whose
    end this process has relayed is not, though the queue marks it done only after its end was published."""
    jobs = _queued(session_id, "todo", "doing").values_list("id", "status")
    return any(status == "todo" or _job_states.get(job_id) != "idle" for job_id, status in jobs)


@dataclass(frozen=True)
class Queued:
    """A job queued: its id, and whether the session's tabs were told (the channel layer may be away)."""

    job_id: int
    told: bool


async def start(
    session_id: int, action: Action, *, reply_to: str | None, queue: str = QUEUE, checks_queued: bool = True
) -> Queued | None:
    """Queue ``action`` for the session, every tab of it shown the reply as queued; ``None`` where a job of the
    session already waits. ``reply_to``: the channel of the tab or terminal that asked."""
    from chat.tasks import session_action

    key = session_key(session_id)
    try:
        job_id: int = await session_action.configure(lock=key, queueing_lock=key, queue=queue).defer_async(
            session_id=session_id, action=action.payload(), reply_to=reply_to, checks_queued=checks_queued
        )
    except queue_errors.AlreadyEnqueued:
        return None
    told = await publish(wire.job_message(session_id, state="queued", label=QUEUED, job=job_id))
    return Queued(job_id, told)


def defer(session_id: int, action: Action) -> int | None:
    """Queue ``action`` for the session from synchronous code (a page's POST), telling no tab: the page loads next
    and shows the job queued as it is. The job's id, or ``None`` where a job of the session already waits."""
    from chat.tasks import session_action

    key = session_key(session_id)
    try:
        job_id: int = session_action.configure(lock=key, queueing_lock=key).defer(
            session_id=session_id, action=action.payload(), reply_to=None
        )
    except queue_errors.AlreadyEnqueued:
        return None
    return job_id


def _waiting_jobs(session_id: int) -> list[tuple[int, dict[str, Any]]]:
    return [(job.pk, dict(job.args)) for job in _queued(session_id, "todo")]


async def stop(session_id: int) -> bool:
    """Stop the session's reply wherever it runs, and take out a job of it that still waits in the queue; whether
    the Stop could be sent to the reply (the channel layer may be away)."""
    for job_id, args in await store_call(_waiting_jobs)(session_id):
        if not await queue_app.job_manager.cancel_job_by_id_async(job_id, delete_job=True):
            continue  # a worker took it meanwhile: the Stop below reaches it
        reply_to = args.get("reply_to")
        if isinstance(reply_to, str):  # the tab that asked gets its words back first
            words = args.get("action", {}).get("words")
            if isinstance(words, str):
                await publish(wire.words_back_message(session_id, words), to=reply_to)
            await publish(wire.notice_message(session_id, text=STOPPED_WAITING), to=reply_to)
        await publish(wire.job_message(session_id, state="idle", job=job_id))
        await publish(wire.job_ended_message(session_id, job=job_id, failure=STOPPED_WAITING, requests=[], turn=None))
    return await stop_reply(session_id)
