"""/metrics: off until a token is set, then only to that bearer token or an allowed address; what it says is what
the store holds, in Prometheus's text format as its own parser reads it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, ModelRequest
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-metrics-token"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_are_off_until_a_token_is_set(client: Client, settings: Any) -> None:
    settings.CACHET_METRICS_TOKEN = ""
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404


def test_only_the_token_or_an_allowed_address_gets_them(client: Client, settings: Any) -> None:
    settings.CACHET_METRICS_TOKEN = TOKEN
    settings.CACHET_METRICS_ALLOW = []
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": TOKEN}).status_code == 401, "a bearer token"
    answered = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answered.status_code == 200 and answered["Content-Type"].startswith("text/plain; version=")
    assert client.post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405
    settings.CACHET_METRICS_ALLOW = ["10.0.0.0/8"]
    assert client.get("/metrics").status_code == 401
    settings.CACHET_METRICS_ALLOW = ["192.168.1.7", "127.0.0.0/8"]
    assert client.get("/metrics").status_code == 200, "the test client comes from 127.0.0.1"


def test_the_figures_are_the_stored_requests_per_endpoint(
    client: Client, settings: Any, live_session: ChatSession, model: ScriptedServer
) -> None:
    settings.CACHET_METRICS_TOKEN = TOKEN
    model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="30 lines."))
    run(ReplyLoop(live_session).send("How long are the notes?"))
    model.push(Step(fault="http500"))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("And now?"))

    text = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()

    samples = _samples(text)
    scripted = (("endpoint", "scripted"),)
    stored = ModelRequest.objects.filter(status="done").aggregate(p=Sum("prompt_tokens"), c=Sum("cached_tokens"))
    assert samples[("cachet_requests_total", (("endpoint", "scripted"), ("status", "done")))] == 2
    assert samples[("cachet_requests_total", (("endpoint", "scripted"), ("status", "failed")))] == 1
    assert samples[("cachet_prompt_tokens_total", scripted)] == stored["p"] > 0
    assert samples[("cachet_cached_tokens_total", scripted)] == stored["c"]
    assert samples[("cachet_processed_tokens_total", scripted)] == stored["p"] - stored["c"]
    assert samples[("cachet_time_to_first_token_seconds_count", scripted)] == 2
    assert samples[("cachet_time_to_first_token_seconds_bucket", (("endpoint", "scripted"), ("le", "+Inf")))] == 2
    assert samples[("cachet_time_to_first_token_seconds_bucket", (("endpoint", "scripted"), ("le", "60.0")))] == 2
    assert samples[("cachet_time_to_first_token_seconds_sum", scripted)] > 0
    assert samples[("cachet_replies", (("state", "running"),))] == 0
    assert samples[("cachet_replies", (("state", "queued"),))] == 0
    assert ("cachet_workers", ()) in samples
    assert "# TYPE cachet_time_to_first_token_seconds histogram" in text
