"""How long the channel layer takes to bring an event to this web process: each event carries the moment its
publisher sent it (``chat.wire.SENT``), and each tab's receipt is counted in a histogram of this process, written
to the store as events arrive, at most every :data:`SAVE_SECONDS` (no timer of its own: a quiet process has nothing
new to write). ``/metrics`` sums every process's (``cachet_channel_layer_delivery_seconds``). Publishers on other
machines measure against their own clock, so a clock that is off shows here."""

from __future__ import annotations

import bisect
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from chat.wire import SENT

DELIVERY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""The upper bounds, in seconds, of the delivery histogram (``+Inf`` comes after)."""
SAVE_SECONDS = 10.0


@dataclass
class DeliveryTally:
    """This process's deliveries since it started: events within each bound (not cumulative here), their count
    and their seconds added up."""

    process: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    within: list[int] = field(default_factory=lambda: [0] * len(DELIVERY_BUCKETS))
    count: int = 0
    total_seconds: float = 0.0
    saved_at: float = 0.0

    def observe(self, message: Mapping[str, Any], *, now: float | None = None) -> bool:
        """Count ``message``'s delivery (one carrying no time is not counted); whether it is time to save."""
        sent = message.get(SENT)
        if not isinstance(sent, int | float) or isinstance(sent, bool):
            return False
        arrived = time.time() if now is None else now
        seconds = max(0.0, arrived - float(sent))
        at = bisect.bisect_left(DELIVERY_BUCKETS, seconds)
        if at < len(self.within):
            self.within[at] += 1
        self.count += 1
        self.total_seconds += seconds
        return arrived - self.saved_at >= SAVE_SECONDS

    def cumulative(self) -> list[int]:
        """The counts as Prometheus's buckets have them: events within each bound."""
        running, counts = 0, []
        for number in self.within:
            running += number
            counts.append(running)
        return counts

    def taken(self) -> Taken:
        """The counts as they stand, to save (``sessions_app.services.delivery.layer_delivery_save``); the next
        save is due :data:`SAVE_SECONDS` from now."""
        self.saved_at = time.time()
        return Taken(
            process=self.process, buckets=self.cumulative(), count=self.count, total_seconds=self.total_seconds
        )


class Taken(TypedDict):
    process: str
    buckets: list[int]
    count: int
    total_seconds: float


TALLY = DeliveryTally()
