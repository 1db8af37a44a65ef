"""Every request added up per endpoint, for Prometheus (``chat.web.metrics``): counts, tokens and the time to the
first token in buckets, read in one query at each scrape, so every web process answers the same."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce

from sessions_app.models import ModelRequest, RequestStatus

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
