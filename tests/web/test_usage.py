"""Usage at a glance: every finished request is added to its person's day by the statement that finishes it; the
page and its CSV show a person their own and staff everyone's, in the figures the session list has."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, UsageDay
from sessions_app.selectors.totals import session_totals
from sessions_app.selectors.usage import usage_report
from sessions_app.services.requests import request_record_finish
from sessions_app.services.usage import usage_days_rebuild
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db

FIELDS = ["requests", "failed", "prompt_tokens", "cached_tokens", "completion_tokens", "prompt_seconds"]


def _days() -> list[tuple[Any, ...]]:
    return list(UsageDay.objects.order_by("day", "owner", "model_name").values_list("day", "owner", *FIELDS))


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(*row[:-1], round(row[-1], 6)) for row in rows]


def test_each_finished_request_is_added_to_its_persons_day_as_a_rebuild_from_the_rows_adds_it(
    live_session: ChatSession, model: ScriptedServer
) -> None:
    model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="30 lines."))
    run(ReplyLoop(live_session).send("How long are the notes?"))
    model.push(Step(fault="http500"))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("And now?"))

    (day,) = UsageDay.objects.all()
    totals = session_totals(live_session)
    assert (day.owner_id, day.endpoint_id, day.model_name) == (
        live_session.owner_id,
        live_session.endpoint_id,
        "scripted",
    )
    assert day.day == timezone.localdate()
    assert (day.requests, day.failed) == (3, 1)
    assert (day.prompt_tokens, day.cached_tokens) == (totals.prompt_tokens, totals.cached_tokens)
    assert day.prompt_tokens > day.cached_tokens > 0
    assert day.completion_tokens == ModelRequest.objects.aggregate(total=Sum("completion_tokens"))["total"]
    assert day.prompt_seconds == pytest.approx(totals.prompt_seconds)

    live = _rounded(_days())
    usage_days_rebuild()
    assert _rounded(_days()) == live, "the live roll-up is what a rebuild from the request rows makes"


def test_a_server_s_timings_that_are_not_numbers_fall_back_to_the_time_to_the_first_token(
    live_session: ChatSession,
) -> None:
    request = _request(live_session)
    request_record_finish(
        request=request,
        prompt_tokens=100,
        cached_tokens=60,
        completion_tokens=5,
        time_to_first_token=0.25,
        total_time=1.0,
        usage=None,
        timings={"prompt_ms": "fast", "prompt_n": [40]},
    )
    timed = _request(live_session)
    request_record_finish(
        request=timed,
        prompt_tokens=100,
        cached_tokens=90,
        completion_tokens=5,
        time_to_first_token=0.5,
        total_time=1.0,
        usage=None,
        timings={"prompt_ms": 200.0, "prompt_n": 10},
    )
    (day,) = UsageDay.objects.all()
    assert (day.requests, day.prompt_tokens, day.cached_tokens) == (2, 200, 150)
    assert day.prompt_seconds == pytest.approx(0.25 + 0.2)
    assert day.timed_tokens == 10 and day.timed_seconds == pytest.approx(0.2)
    report = usage_report(viewer=live_session.owner, since=day.day, until=day.day)
    assert report.totals.saved_seconds == pytest.approx(150 * 0.2 / 10), "cached tokens at the measured speed"


def _request(session: ChatSession) -> ModelRequest:
    return ModelRequest.objects.create(
        session=session,
        endpoint_url="http://model.test/v1",
        model_name="scripted",
        body_sha256="0" * 64,
        bytes_sent=10,
        shared_prefix_bytes=0,
    )


@pytest.fixture
def team(django_user_model: Any, live_endpoint: ModelEndpoint) -> dict[str, Any]:
    """Ada and Bob's usage over the last days, and Staff who sees everyone's."""
    people = {
        "ada": django_user_model.objects.create_user(username="ada", password="pw-ada-1"),
        "bob": django_user_model.objects.create_user(username="bob", password="pw-bob-1"),
        "staff": django_user_model.objects.create_user(username="staff", password="pw-staff-1", is_staff=True),
    }
    today = timezone.localdate()
    for ago, name, prompt, cached in [
        (0, "ada", 1000, 900),
        (1, "ada", 500, 100),
        (2, "bob", 7000, 0),
        (40, "ada", 9, 9),
    ]:
        UsageDay.objects.create(
            day=today - timedelta(days=ago),
            owner=people[name],
            endpoint=live_endpoint,
            model_name="scripted",
            requests=2,
            prompt_tokens=prompt,
            cached_tokens=cached,
            prompt_seconds=1.5,
        )
    return people


def _as(person: Any) -> Client:
    client = Client()
    client.force_login(person)
    return client


def test_a_person_sees_their_own_usage_only(team: dict[str, Any]) -> None:
    ada = _as(team["ada"])
    page = ada.get("/usage/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="usage-people"' not in text and "bob" not in text
    figures = page.context["report"].totals
    assert (figures.requests, figures.prompt_tokens, figures.cached_tokens) == (4, 1500, 1000), "the last 30 days"
    assert ada.get("/usage/?days=90").context["report"].totals.prompt_tokens == 1509
    assert ada.get(f"/usage/?person={team['bob'].pk}").status_code == 404
    assert ada.get(f"/usage.csv?person={team['bob'].pk}").status_code == 404
    assert ada.get("/usage/?days=12").status_code == 404, "a range the page does not offer"
    rows = list(csv.DictReader(io.StringIO(ada.get("/usage.csv").content.decode())))
    assert {row["person"] for row in rows} == {"ada"} and len(rows) == 2


def test_staff_see_everyone_per_person_model_and_day_and_narrow_to_one(team: dict[str, Any]) -> None:
    staff = _as(team["staff"])
    page = staff.get("/usage/")
    report = page.context["report"]
    assert report.totals.prompt_tokens == 8500
    assert [(line.label, line.totals.prompt_tokens) for line in report.people] == [("bob", 7000), ("ada", 1500)]
    assert [line.totals.requests for line in report.endpoints] == [6]
    assert len(report.days) == 30 and report.days[-1].totals.prompt_tokens == 1000
    assert page.context["bars"][-1].cached > 0 and page.context["bars"][-3].cached == 0
    text = page.content.decode()
    assert 'id="usage-people"' in text and 'id="usage-chart"' in text

    narrowed = staff.get(f"/usage/?person={team['bob'].pk}").context["report"]
    assert narrowed.totals.prompt_tokens == 7000
    key = report.endpoints[0].key
    assert staff.get("/usage/", {"endpoint": key}).context["report"].totals.requests == 6
    assert staff.get("/usage/", {"endpoint": "999:other"}).context["report"].totals.requests == 0

    response = staff.get("/usage.csv?days=90")
    assert response["Content-Type"].startswith("text/csv") and "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(row["person"], row["prompt_tokens"], row["cached_share"]) for row in rows] == [
        ("ada", "9", "1.0000"),
        ("bob", "7000", "0.0000"),
        ("ada", "500", "0.2000"),
        ("ada", "1000", "0.9000"),
    ]
    assert rows[0]["endpoint"] == "scripted" and rows[0]["processed_tokens"] == "0"


def test_a_removed_endpoint_s_usage_stays_under_its_model(team: dict[str, Any], live_endpoint: ModelEndpoint) -> None:
    ChatSession.objects.all().delete()
    live_endpoint.delete()
    report = _as(team["staff"]).get("/usage/").context["report"]
    assert [line.label for line in report.endpoints] == ["a removed endpoint · scripted"]
    assert report.totals.prompt_tokens == 8500


def test_nobody_logged_in_is_sent_to_log_in(client: Client) -> None:
    for path in ("/usage/", "/usage.csv"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next=")
