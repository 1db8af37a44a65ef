"""Benchmark: how long a Prometheus scrape of ``/metrics`` takes as the stored requests grow. It prints figures; it
is not a test.

A person's session is stored through Cachet's services on a fresh embedded Postgres, then ``--rows`` finished
requests (a tenth of them failed, times to the first token spread from 10 ms to 20 s) are copied to it in SQL,
spread over ``--endpoints`` endpoints; then ``GET /metrics`` is asked with its token through Django's test client
(the view, its one aggregation over the request rows and the queue's tables, and prometheus-client's text), three
times at each size, the best time counting.

    .venv/bin/python bench/metrics_bench.py [--rows 10000,100000,1000000] [--endpoints 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 3
TOKEN = "bench-metrics-token"


def _setup(data: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["CACHET_DATA"] = str(data)
    os.environ["CACHET_METRICS_TOKEN"] = TOKEN
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _sessions(endpoints: int) -> list[int]:
    from django.contrib.auth.models import User

    from chat.tools import tool_list
    from sessions_app.models import ModelEndpoint, Workspace
    from sessions_app.services.sessions import session_start

    folder = Path(tempfile.mkdtemp(prefix="cachet-metrics-ws-"))
    person = User.objects.create_user("ada")
    workspace = Workspace.objects.create(name="bench", folder=str(folder), open_to_everyone=True, from_shell=True)
    ids = []
    for number in range(endpoints):
        endpoint = ModelEndpoint.objects.create(
            name=f"server-{number}", base_url=f"http://127.0.0.{number + 2}:8080/v1"
        )
        session = session_start(
            owner=person,
            workspace=workspace,
            endpoint=endpoint,
            model_name="bench",
            tools=tool_list(allow_commands=False),
        )
        ids.append(session.pk)
    return ids


def _grow(sessions: list[int], rows: int) -> None:
    """Add finished requests until the table holds ``rows``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM sessions_app_modelrequest")
        have = cursor.fetchone()[0]
        if rows <= have:
            return
        cursor.execute(
            """
            INSERT INTO sessions_app_modelrequest (
                session_id, step_number, kind, endpoint_url, model_name, body_sha256, bytes_sent, shared_prefix_bytes,
                break_cause, expected_shared_bytes, status, error, prompt_tokens, cached_tokens, completion_tokens,
                time_to_first_token, total_time, moved, cache_miss, cache_miss_before, cache_miss_after, started_at,
                finished_at)
            SELECT (%s::int[])[1 + n %% cardinality(%s::int[])], 1, 'reply', 'http://bench/v1', 'bench', '', 1000,
                900, '', 900, CASE WHEN n %% 10 = 0 THEN 'failed' ELSE 'done' END, '', 4000 + n %% 3000,
                3000 + n %% 2000, 50, 0.01 * power(2000, (n %% 997) / 997.0), 2.0, '', '', '', '', now(), now()
            FROM generate_series(%s, %s) AS n
            """,
            [sessions, sessions, have + 1, rows],
        )
        cursor.execute("ANALYZE sessions_app_modelrequest")


def _scrape() -> tuple[float, int]:
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    best, size = float("inf"), 0
    for _ in range(RUNS):
        started = time.perf_counter()
        response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        best = min(best, time.perf_counter() - started)
        assert response.status_code == 200, response.status_code
        size = len(response.content)
    return best, size


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from testing.interrupts import sigterm_as_interrupt

    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,100000,1000000")
    parser.add_argument("--endpoints", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.rows.split(","))
    data = Path(tempfile.mkdtemp(prefix="cachet-metrics-bench-"))
    try:
        _setup(data)
        sessions = _sessions(args.endpoints)
        print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
        print(f"{'requests stored':>16} {'scrape, best of 3':>18} {'bytes':>7}")
        for rows in sizes:
            _grow(sessions, rows)
            seconds, size = _scrape()
            print(f"{rows:>16,} {seconds * 1000:>15.0f} ms {size:>7}")
    finally:
        from django.db import connections

        from cachet.embedded_pg import embedded_stop

        connections.close_all()
        embedded_stop(data)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
