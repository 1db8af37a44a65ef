"""Requests added up. Per endpoint for Prometheus (``chat.web.metrics``): counts, tokens and the time to the first
token in buckets, read in one query over the request rows at each scrape, so every web process answers the same.
Per person, endpoint and day for the usage page and its CSV (``chat.web.usage``), from the daily roll-up
(``UsageDay``) in the figures of :class:`~sessions_app.selectors.totals.RequestTotals`, as the session list has
them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, cast

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from sessions_app.models import LayerDelivery, ModelRequest, RequestStatus, UsageDay
from sessions_app.selectors.totals import RequestTotals

Viewer = AbstractBaseUser | AnonymousUser
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""The upper bounds, in seconds, of the time-to-first-token histogram (``+Inf`` comes after)."""


@dataclass(frozen=True)
class EndpointUsage:
    """One endpoint's requests (by the session's endpoint name) and what they cost, since Cachet began."""

    endpoint: str
    done: int
    failed: int
    prompt_tokens: int
    cached_tokens: int
    ttft_buckets: tuple[int, ...]  # requests with a time to the first token at most each of ``TTFT_BUCKETS``
    ttft_count: int
    ttft_sum: float

    @property
    def processed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def usage_by_endpoint(buckets: Sequence[float] = TTFT_BUCKETS) -> list[EndpointUsage]:
    """Each endpoint's finished requests added up, in one query."""
    timed = Q(status=RequestStatus.DONE, time_to_first_token__isnull=False)
    rows = (
        ModelRequest.objects.exclude(status=RequestStatus.SENDING)
        .values(endpoint=F("session__endpoint__name"))
        .annotate(
            done=Count("id", filter=Q(status=RequestStatus.DONE)),
            failed=Count("id", filter=Q(status=RequestStatus.FAILED)),
            prompt=Coalesce(Sum("prompt_tokens"), 0),
            cached=Coalesce(Sum("cached_tokens"), 0),
            ttft_count=Count("id", filter=timed),
            ttft_sum=Coalesce(Sum("time_to_first_token", filter=timed), 0.0),
            **{
                f"le_{at}": Count("id", filter=timed & Q(time_to_first_token__lte=bound))
                for at, bound in enumerate(buckets)
            },
        )
        .order_by("endpoint")
    )
    found = cast(list[dict[str, Any]], list(rows))
    return [
        EndpointUsage(
            endpoint=row["endpoint"],
            done=row["done"],
            failed=row["failed"],
            prompt_tokens=row["prompt"],
            cached_tokens=row["cached"],
            ttft_buckets=tuple(row[f"le_{at}"] for at in range(len(buckets))),
            ttft_count=row["ttft_count"],
            ttft_sum=float(row["ttft_sum"]),
        )
        for row in found
    ]


@dataclass(frozen=True)
class UsageLine:
    """One line of a usage report: a person, an endpoint's model or a day, and its requests added up."""

    key: str  # what the page's filter takes: a person's id, ``endpoint_id:model`` or the day's ISO date
    label: str
    totals: RequestTotals


@dataclass(frozen=True)
class UsageReport:
    """Requests added up over ``since``…``until`` (days, both in): all of them, per person (for staff), per
    endpoint and model, and per day (every day of the range, those without a request too)."""

    since: date
    until: date
    totals: RequestTotals
    people: list[UsageLine]
    endpoints: list[UsageLine]
    days: list[UsageLine]


@dataclass(frozen=True)
class UsageRow:
    """A row of the usage CSV: one person's requests to one endpoint's model on one day."""

    day: date
    person: str
    endpoint: str
    model: str
    failed: int
    completion_tokens: int
    totals: RequestTotals


_SUMS = {
    "requests_sum": Sum("requests"),
    "prompt_sum": Sum("prompt_tokens"),
    "cached_sum": Sum("cached_tokens"),
    "prompt_seconds_sum": Sum("prompt_seconds"),
    "timed_tokens_sum": Sum("timed_tokens"),
    "timed_seconds_sum": Sum("timed_seconds"),
}


def _found(rows: object) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], list(cast(QuerySet[Any], rows)))


def _rolled(row: dict[str, Any]) -> RequestTotals:
    return RequestTotals(
        requests=int(row["requests_sum"] or 0),
        prompt_tokens=int(row["prompt_sum"] or 0),
        cached_tokens=int(row["cached_sum"] or 0),
        prompt_seconds=float(row["prompt_seconds_sum"] or 0.0),
        timed_tokens=int(row["timed_tokens_sum"] or 0),
        timed_seconds=float(row["timed_seconds_sum"] or 0.0),
    )


def usage_days(
    *, viewer: Viewer, since: date, until: date, person: int | None = None, endpoint: str | None = None
) -> QuerySet[UsageDay]:
    """The roll-up's rows that ``viewer`` may see in the range: a person sees only their own, staff everyone's
    (or ``person``'s); ``endpoint`` (``endpoint_id:model``, as :class:`UsageLine` keys it) narrows them."""
    rows = UsageDay.objects.filter(day__gte=since, day__lte=until)
    if not getattr(viewer, "is_staff", False):
        rows = rows.filter(owner_id=viewer.pk)
    elif person is not None:
        rows = rows.filter(owner_id=person)
    if endpoint is not None:
        endpoint_id, _, model = endpoint.partition(":")
        rows = rows.filter(endpoint_id=int(endpoint_id) if endpoint_id.isdigit() else None, model_name=model)
    return rows


def endpoint_key(endpoint_id: int | None, model: str) -> str:
    return f"{endpoint_id or ''}:{model}"


def _endpoint_label(name: str | None, model: str) -> str:
    return f"{name or 'a removed endpoint'} · {model}" if model else name or "a removed endpoint"


def usage_report(
    *, viewer: Viewer, since: date, until: date, person: int | None = None, endpoint: str | None = None
) -> UsageReport:
    """What the usage page shows, from the roll-up in four queries."""
    rows = usage_days(viewer=viewer, since=since, until=until, person=person, endpoint=endpoint).order_by()
    totals = _rolled(rows.aggregate(**_SUMS))
    people: list[UsageLine] = []
    if getattr(viewer, "is_staff", False):
        by_person = _found(
            rows.values("owner_id", name=F("owner__username")).annotate(**_SUMS).order_by(F("prompt_sum").desc())
        )
        people = [UsageLine(str(row["owner_id"]), row["name"], _rolled(row)) for row in by_person]
    by_endpoint = _found(
        rows.values("endpoint_id", "model_name", name=F("endpoint__name"))
        .annotate(**_SUMS)
        .order_by(F("prompt_sum").desc())
    )
    endpoints = [
        UsageLine(
            endpoint_key(row["endpoint_id"], row["model_name"]),
            _endpoint_label(row["name"], row["model_name"]),
            _rolled(row),
        )
        for row in by_endpoint
    ]
    by_day = {row["day"]: _rolled(row) for row in _found(rows.values("day").annotate(**_SUMS))}
    days = []
    day = since
    while day <= until:
        days.append(UsageLine(day.isoformat(), day.isoformat(), by_day.get(day, RequestTotals())))
        day += timedelta(days=1)
    return UsageReport(since=since, until=until, totals=totals, people=people, endpoints=endpoints, days=days)


def usage_rows(
    *, viewer: Viewer, since: date, until: date, person: int | None = None, endpoint: str | None = None
) -> Iterator[UsageRow]:
    """The CSV's rows, by day, person, endpoint and model."""
    rows = usage_days(viewer=viewer, since=since, until=until, person=person, endpoint=endpoint)
    found = rows.order_by("day", "owner__username", "endpoint__name", "model_name").values(
        "day",
        "model_name",
        "failed",
        "completion_tokens",
        person=F("owner__username"),
        name=F("endpoint__name"),
        requests_sum=F("requests"),
        prompt_sum=F("prompt_tokens"),
        cached_sum=F("cached_tokens"),
        prompt_seconds_sum=F("prompt_seconds"),
        timed_tokens_sum=F("timed_tokens"),
        timed_seconds_sum=F("timed_seconds"),
    )
    for row in cast(Iterator[dict[str, Any]], found.iterator(chunk_size=2000)):
        yield UsageRow(
            day=row["day"],
            person=row["person"],
            endpoint=row["name"] or "a removed endpoint",
            model=row["model_name"],
            failed=row["failed"],
            completion_tokens=row["completion_tokens"],
            totals=_rolled(row),
        )


def layer_delivery_added(size: int) -> tuple[list[int], int, float]:
    """Every web process's channel-layer deliveries added up: the cumulative counts of ``size`` buckets, the count
    and the seconds (``LayerDelivery``)."""
    buckets = [0] * size
    count, total = 0, 0.0
    for row in LayerDelivery.objects.values("buckets", "count", "total_seconds"):
        saved = row["buckets"] if isinstance(row["buckets"], list) else []
        for at, number in enumerate(saved[:size]):
            buckets[at] += int(number)
        count += row["count"]
        total += row["total_seconds"]
    return buckets, count, total
