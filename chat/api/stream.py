"""A session's typed events (``chat.wire``) as Server-Sent Events: each one ``event: NAME`` and ``data: JSON``, the
JSON the event as every tab's web process hears it (``result_stored`` also names its result as the model saw it,
``#0012``; ``turn_ended`` says the turn's number, status and error). A job's stream ends with its ``job_ended``;
a session's goes on until the client leaves. A comment line every :data:`KEEPALIVE_SECONDS` keeps proxies from
closing a quiet stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer
from django.http import StreamingHttpResponse

from chat import wire
from chat.follow import VANISHED_LOOKS, WATCH_SECONDS, WORKER_STOPPED, Quiet, job_events
from chat.web.display import result_id
from chat.web.socket_store import store_call
from sessions_app.models import Result, Turn

KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keepalive\n\n"
HIDDEN_FIELDS = frozenset({"type", wire.SENT})
JOB_GONE = (
    "The job is no longer in the queue: it ended before this stream began (read the session's turns), or its "
    "worker stopped."
)


def _result_number(result_pk: int) -> int | None:
    number: int | None = Result.objects.filter(pk=result_pk).values_list("number", flat=True).first()
    return number


def _turn_outcome(turn_pk: int) -> dict[str, Any]:
    found = Turn.objects.filter(pk=turn_pk).values("number", "status", "error").first()
    return dict(found) if found is not None else {}


async def event_bytes(event: Mapping[str, Any]) -> bytes:
    """One event as its Server-Sent Event."""
    data = {key: value for key, value in event.items() if key not in HIDDEN_FIELDS}
    if event["event"] == "result_stored":
        number = await store_call(_result_number)(event["result"])
        if number is not None:
            data.update(id=result_id(number), number=number)
    elif event["event"] == "turn_ended":  # how it ended: done, failed (and why) or interrupted
        data.update(await store_call(_turn_outcome)(event["turn"]))
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['event']}\ndata: {text}\n\n".encode()


def _ended(session_id: int, job_id: int, failure: str) -> dict[str, Any]:
    return wire.job_ended_message(session_id, job=job_id, failure=failure, requests=[], turn=None)


async def _job_stream(
    layer: BaseChannelLayer, channel: str, session_id: int, job_id: int, *, gone: str
) -> AsyncIterator[bytes]:
    vanished = quiet = 0
    keepalive_looks = max(1, round(KEEPALIVE_SECONDS / WATCH_SECONDS))
    async with contextlib.aclosing(job_events(layer, channel, job_id)) as events:
        async for event in events:
            if not isinstance(event, Quiet):
                yield await event_bytes(event)
                continue
            quiet += 1
            vanished = vanished + 1 if event.state is None else 0
            if vanished >= VANISHED_LOOKS:
                yield await event_bytes(_ended(session_id, job_id, gone))
                return
            if quiet % keepalive_looks == 0:
                yield KEEPALIVE


async def _session_stream(layer: BaseChannelLayer, channel: str) -> AsyncIterator[bytes]:
    receiving = asyncio.ensure_future(layer.receive(channel))
    try:
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=KEEPALIVE_SECONDS)
            if not done:
                yield KEEPALIVE
                continue
            message = receiving.result()
            receiving = asyncio.ensure_future(layer.receive(channel))
            try:
                event = wire.checked(message)
            except wire.WireError:
                continue
            yield await event_bytes(event)
    finally:
        receiving.cancel()


async def _left(
    layer: BaseChannelLayer, channel: str, session_id: int, stream: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield chunk
    finally:
        with contextlib.suppress(Exception):
            await layer.group_discard(wire.session_group(session_id), channel)


async def joined(session_id: int) -> tuple[BaseChannelLayer, str]:
    """A new channel in the session's group: everything published to the session from now on reaches it."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    channel = await layer.new_channel()
    await layer.group_add(wire.session_group(session_id), channel)
    return layer, channel


def response(stream: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """``stream`` as a response no proxy buffers or caches."""
    answer = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
    answer["Cache-Control"] = "no-cache"
    answer["X-Accel-Buffering"] = "no"
    return answer


def job_response(
    layer: BaseChannelLayer, channel: str, session_id: int, job_id: int, *, gone: str = WORKER_STOPPED
) -> StreamingHttpResponse:
    """The events of job ``job_id`` that ``channel`` (joined to the session's group) hears, to its ``job_ended``;
    where the job leaves the queue without one, a ``job_ended`` whose failure is ``gone``."""
    return response(_left(layer, channel, session_id, _job_stream(layer, channel, session_id, job_id, gone=gone)))


def session_response(layer: BaseChannelLayer, channel: str, session_id: int) -> StreamingHttpResponse:
    """Every event published to the session while the client listens."""
    return response(_left(layer, channel, session_id, _session_stream(layer, channel)))
