"""A reply loop's action (an async generator of events) run to its end from synchronous code: a benchmark's script
or a test. Its store calls run on the caller's thread (``async_to_sync`` keeps them there), inside whatever
transaction the caller holds."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TypeVar

from asgiref.sync import async_to_sync, sync_to_async

E = TypeVar("E")


async def _collected(action: AsyncGenerator[E, None], each: Callable[[E], None] | None) -> list[E]:
    events = []
    async for event in action:
        events.append(event)
        if each is not None:
            await sync_to_async(each, thread_sensitive=True)(event)
    return events


def run_to_end(action: AsyncGenerator[E, None], *, each: Callable[[E], None] | None = None) -> list[E]:
    """Iterate ``action`` to its end and return its events, calling ``each`` with every event as it comes (on the
    caller's thread too: it may read or change the store, set a cancel)."""
    return async_to_sync(_collected)(action, each)
