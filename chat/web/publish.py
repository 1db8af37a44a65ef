"""The one publish function of a web process: the typed events a tab's request causes (``chat.wire``: a job queued
or taken out, a mode or model changed), checked against their schemas, to the session's group or one channel; and
what a tab asks of the process running the session's reply (Stop, its live text), to that session's reply group."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from channels.layers import get_channel_layer

from chat.wire import LIVE, STOP, TO_ONE, checked, reply_group, session_group, stamped

logger = logging.getLogger(__name__)


_failing = False  # the channel layer refused this process's last publish: one warning per outage


async def publish(message: Mapping[str, Any], *, to: str | None = None) -> bool:
    """Send the event ``message`` to ``to``, or to its session's group; whether the channel layer took it. A layer
    that is away costs a warning when it goes and one when it is back: what was stored stays stored, and tabs
    catch up from the store when they connect again."""
    global _failing
    checked(message)
    if message["event"] in TO_ONE and to is None:
        return False
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    try:
        if to is None:
            await layer.group_send(session_group(message["session"]), stamped(message))
        else:
            await layer.send(to, stamped(message))
    except Exception as error:
        if not _failing:
            logger.warning("could not tell the other tabs (the channel layer: %r); they catch up", error)
        _failing = True
        return False
    if _failing:
        logger.warning("telling the other tabs again")
        _failing = False
    return True


async def _to_reply(session_id: int, message: dict[str, Any]) -> bool:
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    try:
        await layer.group_send(reply_group(session_id), message)
    except Exception as error:
        logger.warning("session %s: could not reach its reply (the channel layer: %r)", session_id, error)
        return False
    return True


async def stop_reply(session_id: int) -> bool:
    """Ask whichever process runs the session's reply to stop it; whether the channel layer took the request."""
    return await _to_reply(session_id, {"type": STOP})


async def ask_live(session_id: int, reply_to: str) -> bool:
    """Ask whichever process runs the session's reply to send ``reply_to`` what the step has streamed."""
    return await _to_reply(session_id, {"type": LIVE, "reply_to": reply_to})
