"""A session's requests added up: what its chart's summary line, the session list and the admin show."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, F, FloatField, IntegerField, OuterRef, Q, QuerySet, Subquery, Sum, Value
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
    timed = Q(server_ms__isnull=False, server_n__isnull=False)
    row = (
        _finished(ModelRequest.objects.filter(session=session))
        .annotate(
            server_ms=Cast(KT("timings__prompt_ms"), FloatField()),
            server_n=Cast(Cast(KT("timings__prompt_n"), FloatField()), IntegerField()),
        )
        .aggregate(
            requests=Count("pk"),
            prompt=Coalesce(Sum("prompt_tokens"), 0),
            cached=Coalesce(Sum("cached_tokens"), 0),
            server_seconds=Coalesce(Sum(F("server_ms") / 1000.0), Value(0.0)),
            untimed_seconds=Coalesce(Sum("time_to_first_token", filter=Q(server_ms__isnull=True)), Value(0.0)),
            timed_tokens=Coalesce(Sum("server_n", filter=timed), 0),
            timed_seconds=Coalesce(Sum(F("server_ms") / 1000.0, filter=timed), Value(0.0)),
        )
    )
    return RequestTotals(
        requests=row["requests"],
        prompt_tokens=row["prompt"],
        cached_tokens=row["cached"],
        prompt_seconds=row["server_seconds"] + row["untimed_seconds"],
        timed_tokens=row["timed_tokens"],
        timed_seconds=row["timed_seconds"],
    )


def with_totals(sessions: QuerySet[ChatSession]) -> QuerySet[ChatSession]:
    """``sessions`` with ``request_count``, ``prompt_sum`` and ``cached_sum`` of their finished requests, each a
    subquery (no join that multiplies rows)."""

    def summed(field: str) -> Subquery:
        rows = _finished(ModelRequest.objects.filter(session=OuterRef("pk"))).order_by().values("session")
        return Subquery(rows.annotate(total=Sum(field)).values("total")[:1])

    counted = _finished(ModelRequest.objects.filter(session=OuterRef("pk"))).order_by().values("session")
    return sessions.annotate(
        request_count=Coalesce(Subquery(counted.annotate(n=Count("pk")).values("n")[:1]), 0),
        prompt_sum=Coalesce(summed("prompt_tokens"), 0),
        cached_sum=Coalesce(summed("cached_tokens"), 0),
    )
