"""A session's requests added up: what its chart's summary line, the session list and the admin show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db.models import (
    Aggregate,
    Count,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from sessions_app.models import ChatSession, ModelRequest, RequestStatus


@dataclass(frozen=True)
class RequestTotals:
    """Requests added up. ``prompt_seconds`` is the server's own prompt time where it reports one (llama.cpp's
    ``timings.prompt_ms``), else the time to the first token; ``timed_tokens`` and ``timed_seconds`` are the
    processed tokens and prompt time of the requests the server timed, its measured speed."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_seconds: float = 0.0
    timed_tokens: int = 0
    timed_seconds: float = 0.0

    @property
    def processed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def saved_seconds(self) -> float | None:
        """What computing the cached tokens would have taken at the server's measured speed."""
        if not self.timed_tokens or not self.timed_seconds:
            return None
        return self.cached_tokens * self.timed_seconds / self.timed_tokens

    def plus(self, request: ModelRequest) -> RequestTotals:
        """These totals with ``request`` (finished) added."""
        prompt, cached = request.prompt_tokens or 0, request.cached_tokens or 0
        server_ms = _number((request.timings or {}).get("prompt_ms"))
        server_n = _number((request.timings or {}).get("prompt_n"))
        timed = server_ms is not None and server_n is not None
        seconds = server_ms / 1000 if server_ms is not None else request.time_to_first_token or 0.0
        return RequestTotals(
            requests=self.requests + 1,
            prompt_tokens=self.prompt_tokens + prompt,
            cached_tokens=self.cached_tokens + cached,
            prompt_seconds=self.prompt_seconds + seconds,
            timed_tokens=self.timed_tokens + (int(server_n) if timed and server_n is not None else 0),
            timed_seconds=self.timed_seconds + (seconds if timed else 0.0),
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _finished(requests: QuerySet[ModelRequest]) -> QuerySet[ModelRequest]:
    return requests.exclude(status=RequestStatus.SENDING)


def session_totals(session: ChatSession) -> RequestTotals:
    """The session's finished requests added up, in one query."""
    return listed_totals(with_totals(ChatSession.objects.filter(pk=session.pk)).get())


def _timed(requests: QuerySet[ModelRequest]) -> QuerySet[ModelRequest]:
    """``requests`` with the server's own prompt time and count, where it reported them (llama.cpp's timings)."""
    return requests.annotate(
        server_ms=Cast(KT("timings__prompt_ms"), FloatField()),
        server_n=Cast(Cast(KT("timings__prompt_n"), FloatField()), IntegerField()),
    )


def _aggregates() -> dict[str, Aggregate]:
    """The totals of :func:`_timed` requests, by the names :func:`listed_totals` reads."""
    timed = Q(server_ms__isnull=False, server_n__isnull=False)
    seconds = F("server_ms") / 1000.0
    return {
        "request_count": Count("pk"),
        "prompt_sum": Sum("prompt_tokens"),
        "cached_sum": Sum("cached_tokens"),
        "prompt_seconds_sum": Sum(Coalesce(seconds, F("time_to_first_token"), Value(0.0))),
        "timed_tokens_sum": Sum("server_n", filter=timed),
        "timed_seconds_sum": Sum(seconds, filter=timed),
    }


def with_totals(sessions: QuerySet[ChatSession]) -> QuerySet[ChatSession]:
    """``sessions`` with their finished requests added up, each figure a subquery (no join that multiplies rows):
    ``request_count``, ``prompt_sum``, ``cached_sum`` and the timings :func:`listed_totals` reads."""
    rows = _timed(_finished(ModelRequest.objects.filter(session=OuterRef("pk")))).order_by().values("session")
    figures = {}
    for name, total in _aggregates().items():
        default = Value(0) if name in ("request_count", "prompt_sum", "cached_sum", "timed_tokens_sum") else Value(0.0)
        figures[name] = Coalesce(Subquery(rows.annotate(total=total).values("total")[:1]), default)
    return sessions.annotate(**figures)


def listed_totals(session: ChatSession) -> RequestTotals:
    """The totals of a session from :func:`with_totals` (none where it was not annotated)."""
    return _totals(lambda name: getattr(session, name, None))


def _totals(figure: Callable[[str], object]) -> RequestTotals:
    def number(name: str) -> float:
        value = figure(name)
        return float(value) if isinstance(value, int | float) else 0.0

    return RequestTotals(
        requests=int(number("request_count")),
        prompt_tokens=int(number("prompt_sum")),
        cached_tokens=int(number("cached_sum")),
        prompt_seconds=number("prompt_seconds_sum"),
        timed_tokens=int(number("timed_tokens_sum")),
        timed_seconds=number("timed_seconds_sum"),
    )


@dataclass(frozen=True)
class ChartTally:
    """Where a session's chart stands after its finished requests: how many bars it has, the newest time to first
    token (where the next bar's line goes on from) and the totals of its summary line. Read once by an action
    (:func:`chart_tally`) and carried on with each request it finishes (:meth:`plus`), so that showing a bar costs
    no query over the whole session."""

    bars: int = 0
    last_time_to_first_token: float | None = None
    totals: RequestTotals = RequestTotals()

    def plus(self, request: ModelRequest) -> ChartTally:
        """The tally with ``request`` (finished, newer than every request counted) added."""
        ttft = request.time_to_first_token
        return ChartTally(
            bars=self.bars + 1,
            last_time_to_first_token=ttft if ttft is not None else self.last_time_to_first_token,
            totals=self.totals.plus(request),
        )


def chart_tally(session: ChatSession) -> ChartTally:
    """The session's chart as its finished requests leave it (two queries)."""
    finished = _finished(ModelRequest.objects.filter(session=session))
    figures = _timed(finished).aggregate(**_aggregates())
    totals = _totals(figures.get)
    newest = finished.exclude(time_to_first_token=None).order_by("-id")
    ttft = newest.values_list("time_to_first_token", flat=True).first()
    return ChartTally(bars=totals.requests, last_time_to_first_token=ttft, totals=totals)
