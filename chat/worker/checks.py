"""A request's cache check, run in a job of its own with the other checks of its action (``chat.tasks.cache_checks``):
it asks the model server to render and tokenize the prompt, which takes a second or more on a long one, so it never
holds the session it belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.db import close_old_connections

from chat import wire
from chat.agent.cache_check import CheckSpec, run_check
from chat.agent.events import BarPlace, CacheChecked
from chat.agent.loop import close_connection, store
from chat.worker.publish import publish


async def run(spec_json: Mapping[str, Any]) -> None:
    """Check the request of the spec, store the check and tell the session's tabs."""
    spec = CheckSpec.from_json(spec_json)
    async with ThreadSensitiveContext():
        await store(close_old_connections)
        try:
            request = await run_check(spec)
        finally:
            await store(close_connection)
    if request is not None:
        place = BarPlace(spec.bar, spec.previous_ttft)
        await publish(wire.event_message(request.session_id, CacheChecked(request, place)))
