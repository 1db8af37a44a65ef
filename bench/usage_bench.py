"""Benchmark: the usage page (``/usage/``) and its CSV at a year of a team's requests, read from the daily roll-up
as Cachet reads it, beside the same figures added up from the request rows (what the page would cost without the
roll-up). It prints figures; it is not a test.

On a fresh embedded Postgres, ``--people`` people (50) each get a session a week on one of ``--endpoints`` endpoints
(2); ``--requests`` finished requests a working day each (100; a tenth failed, some with llama.cpp's timings) over
``--days`` days (365, five working days a week: 1.3 million rows at the defaults) are copied to the request table in
SQL, and the roll-up is made from them by the function the upgrade that made it runs (timed: what that upgrade
costs at this size). Then, through Django's test client, three times each, the best time counting: staff's page over
a year, over 30 days and narrowed to one person; a person's own page over a year; staff's CSV over a year; and,
for comparison, one query adding up a year of the request rows per person (the page's per-person table alone).
The roll-up's statement that finishes a request is timed too: a thousand requests finished one by one.

    .venv/bin/python bench/usage_bench.py [--people 50] [--days 365] [--requests 100] [--endpoints 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 3


def _setup(data: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["CACHET_DATA"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _team(people: int, days: int, endpoints: int) -> list[int]:
    """A session a week per person, in SQL; the people made through Django."""
    from django.contrib.auth.models import User
    from django.db import connection

    from chat.tools import tool_list
    from sessions_app.models import ChatSession, ModelEndpoint, Workspace
    from sessions_app.services.sessions import session_start

    folder = Path(tempfile.mkdtemp(prefix="cachet-usage-ws-"))
    workspace = Workspace.objects.create(name="bench", folder=str(folder), open_to_everyone=True, from_shell=True)
    servers = [
        ModelEndpoint.objects.create(name=f"server-{n}", base_url=f"http://127.0.0.{n + 2}:8080/v1", model="bench")
        for n in range(endpoints)
    ]
    persons = [User.objects.create_user(f"person{n:02d}") for n in range(people)]
    User.objects.create_user("staff", is_staff=True)
    first = session_start(
        owner=persons[0],
        workspace=workspace,
        endpoint=servers[0],
        model_name="bench",
        tools=tool_list(allow_commands=False),
    )
    weeks = days // 7 + 1
    chosen = {
        "owner_id": "(%(people)s::int[])[1 + p]",
        "endpoint_id": "(%(servers)s::int[])[1 + (p + w) %% cardinality(%(servers)s::int[])]",
        "title": "'week ' || w",
    }
    columns = [str(field.column) for field in ChatSession._meta.concrete_fields if not field.primary_key]
    values = ", ".join(chosen.get(column, f"s.{column}") for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO sessions_app_chatsession ({', '.join(columns)}) SELECT {values}"
            " FROM sessions_app_chatsession s, generate_series(0, %(count)s - 1) p, generate_series(0, %(weeks)s - 1) w"
            " WHERE s.id = %(first)s ORDER BY p, w RETURNING id",
            {
                "people": [u.pk for u in persons],
                "servers": [e.pk for e in servers],
                "count": people,
                "weeks": weeks,
                "first": first.pk,
            },
        )
        return [row[0] for row in cursor.fetchall()]


def _requests(sessions: list[int], people: int, days: int, per_day: int) -> int:
    """``per_day`` finished requests a working day for each person, each in their session of that week."""
    from django.db import connection

    weeks = days // 7 + 1
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO sessions_app_modelrequest (
                session_id, step_number, kind, endpoint_url, model_name, body_sha256, bytes_sent, shared_prefix_bytes,
                break_cause, expected_shared_bytes, status, error, prompt_tokens, cached_tokens, completion_tokens,
                time_to_first_token, total_time, moved, cache_miss, cache_miss_before, cache_miss_after, timings,
                started_at, finished_at)
            SELECT (%s::int[])[1 + p * %s + d / 7], 1, 'reply', 'http://bench/v1', 'bench', '', 1000, 900, '', 900,
                   CASE WHEN r %% 10 = 0 THEN 'failed' ELSE 'done' END, '', 4000 + r * 37 %% 3000, 3000 + r %% 2000,
                   50, 0.05 + (r %% 7) / 10.0, 2.0, '', '', '', '',
                   CASE WHEN r %% 3 = 0 THEN jsonb_build_object('prompt_ms', 120.5 + r, 'prompt_n', 1000 + r) END,
                   now() - make_interval(days => d), now() - make_interval(days => d)
              FROM generate_series(0, %s - 1) p, generate_series(0, %s - 1) d, generate_series(0, %s - 1) r
             WHERE extract(isodow FROM now() - make_interval(days => d)) < 6
            """,
            [sessions, weeks, people, days, per_day],
        )
        count = cursor.rowcount
        cursor.execute("ANALYZE sessions_app_modelrequest")
    return int(count)


def _best(call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(RUNS):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _page(client: object, path: str) -> Callable[[], object]:
    def get() -> object:
        response = client.get(path)  # type: ignore[attr-defined]
        assert response.status_code == 200, (path, response.status_code)
        return response.content

    return get


def _raw_per_person() -> object:
    """A year of request rows added up per person, as the roll-up's figures are: without the roll-up."""
    from django.db.models import F

    from sessions_app.models import ModelRequest, RequestStatus
    from sessions_app.selectors.totals import _aggregates, _timed

    rows = _timed(ModelRequest.objects.exclude(status=RequestStatus.SENDING)).values(person=F("session__owner_id"))
    return list(rows.annotate(**_aggregates()).order_by())


def _finishing(sessions: list[int], count: int, *, rolled_up: bool) -> float:
    """Seconds a request's finish takes, each its own statement as a reply finishes them: with its roll-up (as
    Cachet does), or the row's ``UPDATE`` alone (as before the roll-up)."""
    from django.utils import timezone

    from sessions_app.models import ModelRequest
    from sessions_app.services.durability import WITHOUT_WAITING
    from sessions_app.services.requests import request_record_finish
    from sessions_app.services.rows import row_update

    made = [
        ModelRequest.objects.create(
            session_id=sessions[n % len(sessions)],
            endpoint_url="http://bench/v1",
            model_name="bench",
            body_sha256="",
            bytes_sent=1000,
            shared_prefix_bytes=900,
        )
        for n in range(count)
    ]
    started = time.perf_counter()
    for request in made:
        if not rolled_up:  # what request_record_finish wrote before the roll-up
            request.prompt_tokens, request.cached_tokens, request.completion_tokens = 5000, 4800, 40
            request.time_to_first_token, request.total_time, request.status = 0.2, 1.0, "done"
            request.timings = {"prompt_ms": 30.0, "prompt_n": 200}
            request.finished_at = timezone.now()
            fields = ["prompt_tokens", "cached_tokens", "completion_tokens", "time_to_first_token", "total_time"]
            row_update(request, [*fields, "usage", "timings", "error", "status", "finished_at"], also=WITHOUT_WAITING)
            continue
        request_record_finish(
            request=request,
            prompt_tokens=5000,
            cached_tokens=4800,
            completion_tokens=40,
            time_to_first_token=0.2,
            total_time=1.0,
            usage=None,
            timings={"prompt_ms": 30.0, "prompt_n": 200},
        )
    return (time.perf_counter() - started) / count


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from testing.interrupts import sigterm_as_interrupt

    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=50)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--requests", type=int, default=100, help="finished requests a person a working day")
    parser.add_argument("--endpoints", type=int, default=2)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="cachet-usage-bench-"))
    try:
        _setup(data)
        from django.contrib.auth.models import User
        from django.test import Client

        from sessions_app.models import UsageDay
        from sessions_app.services.usage import usage_days_rebuild

        sessions = _team(args.people, args.days, args.endpoints)
        started = time.perf_counter()
        stored = _requests(sessions, args.people, args.days, args.requests)
        seeded = time.perf_counter() - started
        started = time.perf_counter()
        usage_days_rebuild()
        rebuilt = time.perf_counter() - started
        days = UsageDay.objects.count()
        load = " ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"{os.cpu_count()} CPUs, load average {load}")
        print(f"{stored:,} requests of {args.people} people over {args.days} days stored in {seeded:.1f} s;")
        print(f"the roll-up made from them in {rebuilt:.1f} s: {days:,} rows (person, endpoint's model, day)")
        staff, person = Client(HTTP_HOST="127.0.0.1"), Client(HTTP_HOST="127.0.0.1")
        staff.force_login(User.objects.get(username="staff"))
        person.force_login(User.objects.get(username="person00"))
        one = User.objects.get(username=f"person{min(7, args.people - 1):02d}").pk
        figures = [
            ("staff's page, a year", _best(_page(staff, "/usage/?days=365"))),
            ("staff's page, 30 days", _best(_page(staff, "/usage/?days=30"))),
            ("staff's page, a year, one person", _best(_page(staff, f"/usage/?days=365&person={one}"))),
            ("a person's own page, a year", _best(_page(person, "/usage/?days=365"))),
            ("staff's CSV, a year", _best(_page(staff, "/usage.csv?days=365"))),
        ]
        raw = _best(_raw_per_person)
        print(f"{'':40} {'best of 3':>10}")
        for name, seconds in figures:
            print(f"{name:40} {seconds * 1000:>7.0f} ms")
        page = figures[0][1]
        print(f"{'the request rows per person, no roll-up':40} {raw * 1000:>7.0f} ms")
        print(f"staff's year page against the per-person query over the rows alone: {page / raw:.3f}x")
        plain = _finishing(sessions, 1000, rolled_up=False)
        finish = _finishing(sessions, 1000, rolled_up=True)
        print(
            f"a request finished, one statement, mean of 1,000: {finish * 1000:.2f} ms with its roll-up, "
            f"{plain * 1000:.2f} ms the row alone"
        )
    finally:
        from django.db import connections

        from cachet.embedded_pg import embedded_stop

        connections.close_all()
        embedded_stop(data)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
