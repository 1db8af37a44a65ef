"""``/metrics`` in Prometheus's text format, for the Prometheus and Grafana a LAN box usually has: off unless
``CACHET_METRICS_TOKEN`` is set, then answered only to ``Authorization: Bearer <token>`` or to a client address
in ``CACHET_METRICS_ALLOW``. Every figure is read from Postgres at each scrape, so any web process answers the
same: requests, tokens and the time to the first token per endpoint, replies running and queued, and how long
ago each worker last said it was alive."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from procrastinate.contrib.django.models import ProcrastinateJob, ProcrastinateWorker
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from chat.actions import QUEUE
from chat.web.delivery import DELIVERY_BUCKETS
from chat.web.logins import client_address
from sessions_app.selectors.usage import TTFT_BUCKETS, layer_delivery_added, usage_by_endpoint


class CachetCollector(Collector):
    """What Cachet has stored, as Prometheus metrics, read when collected."""

    def collect(self) -> Iterator[Metric]:
        yield from _requests()
        yield from _replies()
        yield from _workers()
        yield from _delivery()


def _requests() -> Iterator[Metric]:
    requests = CounterMetricFamily("cachet_requests", "Requests to the model, finished", labels=["endpoint", "status"])
    prompt = CounterMetricFamily("cachet_prompt_tokens", "Prompt tokens of the requests", labels=["endpoint"])
    cached = CounterMetricFamily("cachet_cached_tokens", "Prompt tokens the server had cached", labels=["endpoint"])
    processed = CounterMetricFamily(
        "cachet_processed_tokens", "Prompt tokens the server processed", labels=["endpoint"]
    )
    ttft = HistogramMetricFamily(
        "cachet_time_to_first_token_seconds", "Time from a request's start to its first token", labels=["endpoint"]
    )
    for usage in usage_by_endpoint():
        requests.add_metric([usage.endpoint, "done"], usage.done)
        requests.add_metric([usage.endpoint, "failed"], usage.failed)
        prompt.add_metric([usage.endpoint], usage.prompt_tokens)
        cached.add_metric([usage.endpoint], usage.cached_tokens)
        processed.add_metric([usage.endpoint], usage.processed_tokens)
        buckets = [(str(bound), count) for bound, count in zip(TTFT_BUCKETS, usage.ttft_buckets, strict=True)]
        ttft.add_metric([usage.endpoint], [*buckets, ("+Inf", usage.ttft_count)], usage.ttft_sum)
    yield from (requests, prompt, cached, processed, ttft)


def _replies() -> Iterator[Metric]:
    replies = GaugeMetricFamily("cachet_replies", "Replies (and undo, rewind, compaction) by state", labels=["state"])
    counts = dict(
        ProcrastinateJob.objects.filter(queue_name=QUEUE, status__in=("todo", "doing"))
        .values_list("status")
        .annotate(count=Count("id"))
        .values_list("status", "count")
    )
    replies.add_metric(["running"], counts.get("doing", 0))
    replies.add_metric(["queued"], counts.get("todo", 0))
    yield replies


def _workers() -> Iterator[Metric]:
    workers = GaugeMetricFamily("cachet_workers", "Workers that said they are alive in the last minute")
    since = GaugeMetricFamily(
        "cachet_worker_heartbeat_age_seconds", "Seconds since each worker last said it is alive", labels=["worker"]
    )
    now = timezone.now()
    alive = 0
    for worker_id, beat in ProcrastinateWorker.objects.values_list("id", "last_heartbeat").order_by("id"):
        age = (now - beat).total_seconds()
        alive += age < 60
        since.add_metric([str(worker_id)], age)
    workers.add_metric([], alive)
    yield from (workers, since)


def _delivery() -> Iterator[Metric]:
    delivery = HistogramMetricFamily(
        "cachet_channel_layer_delivery_seconds",
        "Seconds from an event's publishing to its arrival at a web process, for each tab, every process added up",
    )
    buckets, count, total = layer_delivery_added(len(DELIVERY_BUCKETS))
    shown = [(f"{bound:g}", number) for bound, number in zip(DELIVERY_BUCKETS, buckets, strict=True)]
    delivery.add_metric([], [*shown, ("+Inf", count)], total)
    yield delivery


def _allowed(request: HttpRequest, token: str) -> bool:
    given = request.headers.get("Authorization", "")
    if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), token.encode()):
        return True
    address = client_address(request)
    if not address or not settings.CACHET_METRICS_ALLOW:
        return False
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(client in ipaddress.ip_network(network, strict=False) for network in settings.CACHET_METRICS_ALLOW)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics, to whoever holds the token or scrapes from an allowed address; nobody while it is unset."""
    token: str = settings.CACHET_METRICS_TOKEN
    if not token:
        raise Http404("Metrics are off: set CACHET_METRICS_TOKEN.")
    if not _allowed(request, token):
        response = HttpResponse("A bearer token is needed.", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="cachet metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CachetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
