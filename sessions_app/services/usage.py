"""The daily roll-up of finished requests (``UsageDay``): added to by the statement that finishes a request, and
made again from the request rows where there was none (the migration that made the table).

A request is added by the figures of ``selectors.totals.RequestTotals.plus``; the rebuild adds up the rows in SQL
by the same rules (:data:`ROLLED_UP`): the prompt time is the server's own (llama.cpp's ``timings.prompt_ms``)
where it is a number, else the time to the first token; the timed tokens and seconds are those of the requests the
server timed. ``tests/web/test_usage.py`` holds them to the same totals.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from sessions_app.models import ChatSession, ModelRequest, RequestStatus, UsageDay
from sessions_app.selectors.totals import RequestTotals

_SERVER_MS = "CASE WHEN jsonb_typeof(r.timings -> 'prompt_ms') = 'number' THEN (r.timings ->> 'prompt_ms')::float END"
_SERVER_N = "CASE WHEN jsonb_typeof(r.timings -> 'prompt_n') = 'number' THEN (r.timings ->> 'prompt_n')::float END"
_TIMED = f"({_SERVER_MS}) IS NOT NULL AND ({_SERVER_N}) IS NOT NULL"

COLUMNS = (
    "day, owner_id, endpoint_id, model_name, requests, failed, prompt_tokens, cached_tokens, completion_tokens, "
    "prompt_seconds, timed_tokens, timed_seconds"
)
ROLLED_UP = f"""
SELECT (coalesce(r.finished_at, r.started_at) AT TIME ZONE %(zone)s)::date, s.owner_id, s.endpoint_id, r.model_name,
       count(*), count(*) FILTER (WHERE r.status = %(failed)s),
       coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.cached_tokens), 0), coalesce(sum(r.completion_tokens), 0),
       coalesce(sum(coalesce(({_SERVER_MS}) / 1000.0, r.time_to_first_token, 0.0)), 0.0),
       coalesce(sum(({_SERVER_N})::bigint) FILTER (WHERE {_TIMED}), 0),
       coalesce(sum(({_SERVER_MS}) / 1000.0) FILTER (WHERE {_TIMED}), 0.0)
  FROM {{rows}} r JOIN {ChatSession._meta.db_table} s ON s.id = r.session_id
 WHERE r.status <> %(sending)s
 GROUP BY 1, 2, 3, 4
"""
ADDED = """
ON CONFLICT (day, owner_id, endpoint_id, model_name) DO UPDATE SET
  requests = u.requests + excluded.requests, failed = u.failed + excluded.failed,
  prompt_tokens = u.prompt_tokens + excluded.prompt_tokens, cached_tokens = u.cached_tokens + excluded.cached_tokens,
  completion_tokens = u.completion_tokens + excluded.completion_tokens,
  prompt_seconds = u.prompt_seconds + excluded.prompt_seconds,
  timed_tokens = u.timed_tokens + excluded.timed_tokens, timed_seconds = u.timed_seconds + excluded.timed_seconds
"""


def _params() -> dict[str, Any]:
    return {"zone": settings.TIME_ZONE, "failed": RequestStatus.FAILED, "sending": RequestStatus.SENDING}


def usage_added_sql(update_sql: str, update_values: list[Any], request: ModelRequest) -> tuple[str, list[Any]]:
    """One statement: ``update_sql`` (an ``UPDATE`` of ``request``'s row that finishes it, with its values) and
    ``request`` added to its person's day, by the figures of ``RequestTotals.plus``. It returns one row (a
    ``RETURNING`` may be appended)."""
    added = RequestTotals().plus(request)
    assert request.finished_at is not None
    day = timezone.localdate(request.finished_at)
    failed = 1 if request.status == RequestStatus.FAILED else 0
    table, sessions = UsageDay._meta.db_table, ChatSession._meta.db_table
    sql = (
        f"WITH finished AS ({update_sql} RETURNING session_id) INSERT INTO {table} AS u ({COLUMNS}) "
        f"SELECT %s, s.owner_id, s.endpoint_id, %s, 1, %s, %s, %s, %s, %s, %s, %s "
        f"FROM finished JOIN {sessions} s ON s.id = finished.session_id {ADDED}"
    )
    values = [
        day,
        request.model_name,
        failed,
        added.prompt_tokens,
        added.cached_tokens,
        request.completion_tokens or 0,
        added.prompt_seconds,
        added.timed_tokens,
        added.timed_seconds,
    ]
    return sql, [*update_values, *values]


@transaction.atomic
def usage_days_rebuild() -> int:
    """The roll-up made again from every finished request row there is; how many days' rows it holds."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {UsageDay._meta.db_table}")
        rows = ROLLED_UP.format(rows=ModelRequest._meta.db_table)
        cursor.execute(f"INSERT INTO {UsageDay._meta.db_table} AS u ({COLUMNS})" + rows, _params())
        return int(cursor.rowcount)
