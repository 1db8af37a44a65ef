"""The one publish function of a worker: every typed event it sends (``chat.wire``) goes through it, checked
against its schema, to the session's group (every tab and terminal following the session) or to one channel."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from channels.layers import get_channel_layer

from chat.wire import TO_ONE, checked, session_group, stamped

logger = logging.getLogger(__name__)

_failing = False  # the channel layer refused this process's last publish: one warning per outage


async def publish(message: Mapping[str, Any], *, to: str | None = None) -> None:
    """Send the event ``message`` to ``to``, or to its session's group; a channel layer that is away costs a
    warning when it goes and a line when it is back, and the event (tabs catch up from the store)."""
    global _failing
    checked(message)
    if message["event"] in TO_ONE and to is None:
        return  # meant for one tab that is gone
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    try:
        if to is None:
            await layer.group_send(session_group(message["session"]), stamped(message))
        else:
            await layer.send(to, stamped(message))
    except Exception as error:
        if not _failing:
            logger.warning("could not publish to the session's tabs (the channel layer: %r); they catch up", error)
        _failing = True
        return
    if _failing:
        logger.warning("publishing to the sessions' tabs again")
        _failing = False
