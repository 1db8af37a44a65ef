"""Benchmark: searching a person's sessions as their number grows, the way Cachet searches now (whole words by the
full-text vectors Postgres stores beside each text; pieces inside words only where no whole word matches) against
the way it searched before migration 0011 (every text parsed into a vector by each query, whole words and pieces
inside words looked for together), side by side on the same rows. It prints figures; it is not a test.

One session of ``--turns`` turns (a message of 80 words and a reply of 350, from a small vocabulary with endings,
so common words match nearly everywhere) is stored through Cachet's services, then copied in SQL to ``--sessions``
sessions of one person. Each query runs three times each way; the best time counts.

    .venv/bin/python bench/search_bench.py [--sessions 2000] [--turns 8]

On the embedded Postgres (no ``pg_trgm``) pieces inside words are found by a scan; with ``DATABASE_URL`` set to a
Postgres that has ``pg_trgm``, its trigram indexes serve them.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORDS = [
    "the",
    "a",
    "parser",
    "token",
    "cache",
    "model",
    "server",
    "request",
    "reply",
    "session",
    "workspace",
    "file",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "list",
    "function",
    "class",
    "method",
    "value",
    "error",
    "result",
    "python",
    "rust",
    "code",
    "test",
    "build",
    "run",
]
ENDINGS = ("", "s", "ing", "ed", "er")
QUERIES = ("parser", "parsers cache", "pars", "python rust code", "arser", "zzzz")
RUNS = 3


def _setup(data: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["CACHET_DATA"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _text(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) + rng.choice(ENDINGS) for _ in range(words))


def _build(sessions: int, turns: int) -> Any:
    from django.contrib.auth.models import User
    from django.db import connection

    from chat.tools import tool_list
    from sessions_app.models import ChatSession, ModelEndpoint, Turn, Workspace
    from sessions_app.services.sessions import session_start
    from sessions_app.services.turns import step_record, turn_finish, turn_start

    rng = random.Random(1)
    person = User.objects.create_user("searcher", password="x")
    folder = Path(tempfile.mkdtemp(prefix="cachet-search-ws-"))
    workspace = Workspace.objects.create(name="bench", folder=str(folder), open_to_everyone=True, from_shell=True)
    endpoint = ModelEndpoint.objects.create(name="bench", base_url="http://127.0.0.1:9/v1", model="m")
    seed = session_start(
        owner=person,
        workspace=workspace,
        endpoint=endpoint,
        model_name="m",
        tools=tool_list(allow_commands=False),
        title="seed",
    )
    for _ in range(turns):
        turn = turn_start(session=seed, words=_text(80, rng), today="2026-12-01", instructions=None)
        step_record(turn=turn, number=1, text=_text(350, rng), reasoning="", tool_calls=[], finish_reason="stop")
        turn_finish(turn=turn)
    session_columns = [str(f.column) for f in ChatSession._meta.concrete_fields if f.column != "id"]
    turn_columns = [str(f.column) for f in Turn._meta.concrete_fields if f.column not in ("id", "session_id")]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {ChatSession._meta.db_table} ({','.join(session_columns)}) "
            f"SELECT {','.join(session_columns)} FROM {ChatSession._meta.db_table}, generate_series(2, %s) "
            "WHERE id = %s",
            [sessions, seed.pk],
        )
        cursor.execute(
            f"INSERT INTO {Turn._meta.db_table} (session_id, {','.join(turn_columns)}) "
            f"SELECT s.id, {','.join('t.' + column for column in turn_columns)} "
            f"FROM {Turn._meta.db_table} t, {ChatSession._meta.db_table} s WHERE t.session_id = %s AND s.id <> %s",
            [seed.pk, seed.pk],
        )
        cursor.execute("ANALYZE")
        cursor.execute(f"SELECT count(*), sum(length(words) + length(reply_text)) FROM {Turn._meta.db_table}")
        row = cursor.fetchone()
    print(f"{sessions:,} sessions, {row[0]:,} turns, {row[1] / 1e6:.1f} MB of text")
    return person


def _before(query_text: str, person: Any) -> int:
    """The search as it was before migration 0011: each text parsed per query, words and pieces OR-ed."""
    from django.db import connection

    from sessions_app.models import TurnStatus
    from sessions_app.selectors import search

    query = search.SearchQuery.parse(query_text)
    params: dict[str, str | int] = {
        "owner": person.pk,
        "taken_back": TurnStatus.TAKEN_BACK.value,
        "tsquery": query.tsquery,
    }
    match: dict[str, str] = {}
    rank: dict[str, str] = {}
    partial, _ = search._partial(query, params=params)
    for name, column in search.COLUMNS.items():
        vector = f"to_tsvector('simple'::regconfig, left({column}, {search.FTS_CHARS}))"
        if query.words:
            tsquery = "to_tsquery('simple'::regconfig, %(tsquery)s)"
            match[name] = f"({vector} @@ {tsquery} OR {partial[name]})"
            rank[name] = f"(CASE WHEN {vector} @@ {tsquery} THEN ts_rank({vector}, {tsquery}) ELSE 0 END + 0.01)"
        else:
            match[name], rank[name] = partial[name], "0.01"
    sql = (
        f"WITH hits AS ({search._documents(match, rank, filters='')}) "
        f"SELECT session_id, sum(rank) AS score FROM hits GROUP BY session_id ORDER BY score DESC "
        f"LIMIT {search.SEARCH_LIMIT}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return len(cursor.fetchall())


def _now(query_text: str, person: Any) -> int:
    from sessions_app.selectors.search import session_search

    return len(session_search(owner=person, text=query_text))


def _best(run: Callable[[str, Any], int], query: str, person: Any) -> tuple[float, int]:
    times: list[float] = []
    found = 0
    for _ in range(RUNS):
        started = time.perf_counter()
        found = run(query, person)
        times.append(time.perf_counter() - started)
    return min(times), found


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from testing.interrupts import sigterm_as_interrupt

    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="cachet-search-bench-"))
    try:
        _setup(data)
        from sessions_app.selectors.search import trigram_available

        person = _build(args.sessions, args.turns)
        print(f"pg_trgm: {'yes' if trigram_available() else 'no'}")
        print(f"{'query':<20} {'sessions found':>15} {'before':>10} {'now':>10} {'before/now':>11}")
        for query in QUERIES:
            before, found_before = _best(_before, query, person)
            now, found_now = _best(_now, query, person)
            found = f"{found_before} / {found_now}"
            print(f"{query!r:<20} {found:>15} {before * 1000:>8.0f} ms {now * 1000:>7.0f} ms {before / now:>10.1f}x")
    finally:
        from django.db import connections

        from cachet.embedded_pg import embedded_stop

        connections.close_all()
        embedded_stop(data)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
