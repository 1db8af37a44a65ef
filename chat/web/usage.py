"""Usage at a glance: requests, tokens, the share cached, prompt time and what the cache saved, per person (staff),
per endpoint's model and per day, with a chart over the days and a CSV of the rows. A person sees their own;
staff see everyone's and can narrow to one person. Read from the daily roll-up (``UsageDay``)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from chat.web.chart import totals_brief
from sessions_app.selectors.totals import RequestTotals
from sessions_app.selectors.usage import UsageLine, usage_report, usage_rows

RANGES = [(7, "7 days"), (30, "30 days"), (90, "90 days"), (365, "a year")]
CSV_HEADER = [
    "day",
    "person",
    "endpoint",
    "model",
    "requests",
    "failed",
    "prompt_tokens",
    "cached_tokens",
    "cached_share",
    "processed_tokens",
    "completion_tokens",
    "prompt_seconds",
    "saved_seconds",
]
CHART_HEIGHT = 120


class UsageForm(forms.Form):
    days = forms.TypedChoiceField(choices=RANGES, coerce=int, required=False, empty_value=None)
    person = forms.IntegerField(required=False, min_value=1)
    endpoint = forms.RegexField(regex=r"^\d*:.{0,200}$", required=False)


@dataclass(frozen=True)
class Asked:
    since: date
    until: date
    days: int
    person: int | None
    endpoint: str | None


def _asked(request: HttpRequest) -> Asked:
    """The range and filters the query string asks for; 404 for a person's filter that is not theirs to use."""
    form = UsageForm(request.GET)
    if not form.is_valid():
        raise Http404("No such usage.")
    data = form.cleaned_data
    person = data["person"]
    if person is not None and not request.user.is_staff and person != request.user.pk:
        raise Http404("No such usage.")
    until = timezone.localdate()
    days = data["days"] or 30
    return Asked(until - timedelta(days=days - 1), until, days, person, data["endpoint"] or None)


@dataclass(frozen=True)
class Bar:
    """A day's bar of the chart: its processed tokens on top of its cached ones, heights in the chart's units."""

    x: int
    cached: float
    processed: float
    title: str

    @property
    def cached_y(self) -> float:
        return round(CHART_HEIGHT - self.cached, 2)

    @property
    def processed_y(self) -> float:
        return round(CHART_HEIGHT - self.cached - self.processed, 2)


def _bars(days: list[UsageLine]) -> list[Bar]:
    tallest = max((line.totals.prompt_tokens for line in days), default=0) or 1
    bars = []
    for at, line in enumerate(days):
        totals = line.totals
        cached = CHART_HEIGHT * totals.cached_tokens / tallest
        processed = CHART_HEIGHT * totals.processed_tokens / tallest
        title = f"{line.label}: {totals_brief(totals) or 'no requests'}"
        bars.append(Bar(at, round(cached, 2), round(processed, 2), title))
    return bars


@login_required
@require_GET
def usage_page(request: HttpRequest) -> HttpResponse:
    """The usage page for the range and filters asked."""
    asked = _asked(request)
    report = usage_report(
        viewer=request.user, since=asked.since, until=asked.until, person=asked.person, endpoint=asked.endpoint
    )
    query = request.GET.urlencode()
    context: dict[str, Any] = {
        "report": report,
        "asked": asked,
        "ranges": RANGES,
        "bars": _bars(report.days),
        "chart_width": len(report.days),
        "chart_height": CHART_HEIGHT,
        "busy_days": [line for line in reversed(report.days) if line.totals.requests],
        "csv_query": f"?{query}" if query else "",
        "everyone": request.user.is_staff,
    }
    return render(request, "chat/usage.html", context)


def _number(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


@login_required
@require_GET
def usage_csv(request: HttpRequest) -> HttpResponse:
    """The rows of the range and filters asked, one per day, person, endpoint and model, as CSV."""
    asked = _asked(request)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"cachet-usage-{asked.since.isoformat()}-{asked.until.isoformat()}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow(CSV_HEADER)
    rows = usage_rows(
        viewer=request.user, since=asked.since, until=asked.until, person=asked.person, endpoint=asked.endpoint
    )
    for row in rows:
        totals: RequestTotals = row.totals
        writer.writerow(
            [
                row.day.isoformat(),
                row.person,
                row.endpoint,
                row.model,
                totals.requests,
                row.failed,
                totals.prompt_tokens,
                totals.cached_tokens,
                _number(totals.cached_share, 4),
                totals.processed_tokens,
                row.completion_tokens,
                _number(totals.prompt_seconds, 3),
                _number(totals.saved_seconds, 3),
            ]
        )
    return response
