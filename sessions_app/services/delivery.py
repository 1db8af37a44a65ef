"""What a web process measured of the channel layer's delivery, kept where every process's ``/metrics`` reads it."""

from __future__ import annotations

from collections.abc import Sequence

from sessions_app.models import LayerDelivery


def layer_delivery_save(*, process: str, buckets: Sequence[int], count: int, total_seconds: float) -> None:
    """The process's cumulative delivery counts, as they stand now. One statement."""
    LayerDelivery.objects.bulk_create(
        [LayerDelivery(process=process, buckets=list(buckets), count=count, total_seconds=total_seconds)],
        update_conflicts=True,
        unique_fields=["process"],
        update_fields=["buckets", "count", "total_seconds", "updated_at"],
    )
