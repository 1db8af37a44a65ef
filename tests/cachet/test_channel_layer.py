"""The single-process channel layer (``CACHET_CHANNEL_LAYER=memory``) behaves as Channels' in-memory one, with
less work per message."""

from __future__ import annotations

import asyncio
from typing import Any

import channels.layers
import pytest
from channels.exceptions import ChannelFull

from cachet import channel_layer
from cachet.channel_layer import LocalChannelLayer
from tests.clock import Clock

pytestmark = pytest.mark.asyncio


async def test_a_group_message_reaches_every_member_once_in_order() -> None:
    layer = LocalChannelLayer(capacity=10)
    channels = [await layer.new_channel() for _ in range(3)]
    for channel in channels:
        await layer.group_add("tabs", channel)
    await layer.group_discard("tabs", channels[2])
    for number in range(3):
        await layer.group_send("tabs", {"type": "cachet.message", "text": f"m{number}"})
    for channel in channels[:2]:
        got = [await asyncio.wait_for(layer.receive(channel), 1) for _ in range(3)]
        assert [message["text"] for message in got] == ["m0", "m1", "m2"]
    assert channels[2] not in layer.channels
    await layer.group_send("nobody", {"type": "cachet.message", "text": "lost"})


async def test_each_member_gets_its_own_copy() -> None:
    layer = LocalChannelLayer()
    first, second = await layer.new_channel(), await layer.new_channel()
    for channel in (first, second):
        await layer.group_add("tabs", channel)
    plain = {"type": "cachet.message", "text": "hello"}
    nested: dict[str, Any] = {"type": "reply.live", "ops": [{"id": "a"}]}
    await layer.group_send("tabs", plain)
    await layer.group_send("tabs", nested)
    plain["text"] = "changed"
    nested["ops"][0]["id"] = "changed"
    got_plain = await layer.receive(first)
    got_nested = await layer.receive(first)
    assert got_plain == {"type": "cachet.message", "text": "hello"}
    assert got_nested == {"type": "reply.live", "ops": [{"id": "a"}]}
    got_nested["ops"][0]["id"] = "mine"
    await layer.receive(second)
    assert (await layer.receive(second))["ops"][0]["id"] == "a"


async def test_a_full_channel_refuses_a_send_and_is_skipped_by_a_group_send() -> None:
    layer = LocalChannelLayer(capacity=2)
    full, free = await layer.new_channel(), await layer.new_channel()
    await layer.send(full, {"type": "x"})
    await layer.send(full, {"type": "x"})
    with pytest.raises(ChannelFull):
        await layer.send(full, {"type": "x"})
    for channel in (full, free):
        await layer.group_add("tabs", channel)
    await layer.group_send("tabs", {"type": "y"})
    assert (await layer.receive(free))["type"] == "y"


async def test_expired_messages_are_dropped_with_their_channel_at_most_once_a_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(channel_layer, "time", clock)
    monkeypatch.setattr(channels.layers, "time", clock)
    layer = LocalChannelLayer(expiry=0, clean_seconds=0.2)
    channel = await layer.new_channel()
    await layer.group_add("tabs", channel)
    await layer.send(channel, {"type": "old"})
    clock.advance(0.01)
    await layer.group_send("tabs", {"type": "old"})  # the first clean: the expired message takes its channel away
    assert channel not in layer.channels
    assert channel not in layer.groups.get("tabs", {})

    await layer.group_add("tabs", channel)
    await layer.send(channel, {"type": "old"})
    clock.advance(0.01)
    await layer.group_send("tabs", {"type": "new"})  # within the period: nothing is looked at
    assert channel in layer.groups["tabs"]

    clock.advance(0.25)
    await layer.group_send("tabs", {"type": "later"})
    assert channel not in layer.groups.get("tabs", {})
