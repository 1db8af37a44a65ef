"""No outage loses a message or kills a process (issue 37, item 4): each fault of ``testing.faults`` injected once into
the team layout (two web processes, two workers, one Postgres and Redis through proxies that can be cut), on the
Postgres channel layer and on Redis. Each run counts lost turns, stuck tabs and dead workers, which must all be 0,
and prints how long the tabs took to recover. ``bench/faults.py`` runs each of them ten times.

One layout per layer runs its faults one after the other, in one test (a layout starts in about 10 s; a module
fixture would be started again whenever pytest-xdist hands its worker the next tests in another batch), on the test
database. The test is transactional (the layout's processes write through connections of their own); the task
queue's tables, which the teardown leaves, are emptied after it. The two layers are two xdist groups, so they may
run at once on two test workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection, transaction

from testing.faults import SCENARIOS, Layout, Timing
from tests.redis_kit import RedisDatabase

# a reply of 1.6 s, the fault 1.12 s in (after the first draft, saved a second in), outages of 2 s
TIMING = Timing(pieces=40, piece_delay=0.04, fault_after=28, outage=2.0, settle=10.0)
RECOVERED_WITHIN = 2.0  # a worker's death or Postgres's return: every tab told, the session idle


def _queue_emptied() -> None:
    """The task queue's rows the layout left (its tables have no models Django manages, so the transactional test's
    teardown, which empties the others, leaves them)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
        cursor.execute("DELETE FROM procrastinate_workers")


LAYERS = ["postgres", "redis"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "layer", [pytest.param(layer, marks=pytest.mark.xdist_group(f"faults-{layer}")) for layer in LAYERS]
)
def test_no_fault_mid_reply_loses_a_message_leaves_a_tab_stuck_or_kills_a_worker(
    layer: str, tmp_path: Path, redis_database: RedisDatabase
) -> None:
    redis_database.empty()
    said = []
    failed = []
    try:
        with Layout(layer, base=tmp_path, redis_url=redis_database.url, timing=TIMING) as layout:
            for scenario in SCENARIOS:
                outcome = SCENARIOS[scenario](layout)
                said.append(outcome.said())
                print(outcome.said())
                print(outcome.story())
                slow = scenario in ("kill-9", "postgres-outage") and not (
                    outcome.recovery is not None and outcome.recovery < RECOVERED_WITHIN
                )
                if not outcome.clean or slow:
                    failed.append(outcome.said() + "\n" + outcome.story())
            if failed:
                print(layout.outputs())
    finally:
        _queue_emptied()
        redis_database.empty()
    assert not failed, "\n\n".join(failed)
