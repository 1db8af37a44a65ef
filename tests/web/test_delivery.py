"""The channel layer's delivery time: an event carries when it was sent, each web process counts its tabs'
receipts in a histogram that it writes to the store as events come (at most every few seconds), and /metrics adds
up every process's."""

from __future__ import annotations

import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from chat import wire
from chat.web import delivery
from chat.web.delivery import DELIVERY_BUCKETS, SAVE_SECONDS, DeliveryTally
from chat.worker.publish import publish
from sessions_app.models import ChatSession, LayerDelivery
from sessions_app.services.delivery import layer_delivery_save
from tests.web.test_consumers import ada_cookie, connected, fresh_layer, until

__all__ = ["ada_cookie", "fresh_layer"]  # fixtures, used by name

TOKEN = "delivery-metrics-token"


@pytest.mark.django_db  # the module's tabs have a worker and a fresh channel layer each (fresh_layer)
def test_a_delivery_is_counted_in_its_bucket_and_saving_is_due_every_few_seconds() -> None:
    tally = DeliveryTally(process="box:1", saved_at=1000.0)
    assert not tally.observe({"sent": 1000.0}, now=1000.2)
    assert tally.observe({"sent": 1000.0}, now=1000.0 + SAVE_SECONDS + 3), "due once the seconds passed"
    assert not tally.observe({}, now=1020.0), "an event without its time is not counted"
    assert not tally.observe({"sent": True}, now=1020.0)
    assert tally.count == 2 and tally.total_seconds == pytest.approx(0.2 + SAVE_SECONDS + 3)
    cumulative = tally.cumulative()
    assert cumulative[DELIVERY_BUCKETS.index(0.25)] == 1 and cumulative[DELIVERY_BUCKETS.index(0.1)] == 0
    assert cumulative[-1] == 1, "the slower one is only in +Inf"
    taken = tally.taken()
    assert taken["buckets"] == cumulative and not tally.observe({"sent": time.time()}), "just saved"


@pytest.mark.django_db
def test_metrics_add_up_every_processs_deliveries(client: Client, settings: Any) -> None:
    settings.CACHET_METRICS_TOKEN = TOKEN
    size = len(DELIVERY_BUCKETS)
    layer_delivery_save(process="web-a:1", buckets=[1] * size, count=3, total_seconds=0.5)
    layer_delivery_save(process="web-b:2", buckets=[0] * (size - 1) + [2], count=2, total_seconds=0.75)
    layer_delivery_save(process="web-a:1", buckets=[2] * size, count=4, total_seconds=0.6)  # the same process, later
    text = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("cachet_channel_layer_delivery_seconds")
    }
    assert samples[("cachet_channel_layer_delivery_seconds_count", ())] == 6
    assert samples[("cachet_channel_layer_delivery_seconds_sum", ())] == pytest.approx(1.35)
    assert samples[("cachet_channel_layer_delivery_seconds_bucket", (("le", "0.001"),))] == 2
    assert samples[("cachet_channel_layer_delivery_seconds_bucket", (("le", "2.5"),))] == 4
    assert samples[("cachet_channel_layer_delivery_seconds_bucket", (("le", "+Inf"),))] == 6


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_event_a_worker_publishes_is_timed_at_the_tab_and_written_to_the_store(
    live_session: ChatSession, ada_cookie: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delivery, "TALLY", DeliveryTally(process="test:1"))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await publish(wire.mode_set_message(live_session.pk, mode="plan"))
    await until(communicator, got, lambda m: bool(m.get("ops")))
    row = await database_sync_to_async(LayerDelivery.objects.get)(process="test:1")
    assert row.count == 1 and 0 <= row.total_seconds < 5 and row.buckets[-1] <= 1
    await communicator.disconnect()
