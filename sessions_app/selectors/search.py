"""Searching a person's sessions: titles, their messages and the replies, ranked, with a highlighted snippet.

Whole words and word beginnings are found by Postgres full-text search (``to_tsvector('simple', …)``, stored beside
each text and GIN-indexed); where none match, a piece from inside a word (``arser`` in ``parser``) by ``ILIKE``, which
``pg_trgm``'s GIN indexes speed up where Postgres has the extension. Where it has, and nothing matches either way, a
misspelt word is found by trigram word similarity.
Whatever the sessions hold, a search is three queries and returns at most :data:`SEARCH_LIMIT` sessions; a snippet
is a window of the matching text cut in the database, never the whole text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection

from sessions_app.models import ChatSession, Turn, TurnStatus

SEARCH_LIMIT = 50
FTS_CHARS = 100_000  # the first characters of a text that full-text search indexes (a tsvector holds at most 1 MB)
QUERY_CHARS = 200
MAX_TERMS = 8
SNIPPET_BEFORE = 80
SNIPPET_CHARS = 240
TITLE_WEIGHT = 2.0
PARTIAL_RANK = 0.01
FUZZY_MIN_CHARS = 4
FIELDS = ("title", "message", "reply")


@dataclass(frozen=True)
class SnippetPart:
    text: str
    mark: bool = False


@dataclass(frozen=True)
class SearchHit:
    """A session that matches, where it matches best (``field`` is title, message or reply, ``position`` the
    turn's place in the live branch; a title is shown only when nothing else matches) and a window of that text
    with the query's words marked."""

    session: ChatSession
    field: str
    position: int | None
    score: float
    hits: int
    snippet: tuple[SnippetPart, ...] = ()


@dataclass(frozen=True)
class SearchQuery:
    """A query as the database is asked it: the words for full-text search (each a prefix), the pieces for
    ``ILIKE``, and the query as typed (for trigram similarity)."""

    text: str
    words: tuple[str, ...] = field(default=())
    pieces: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, text: str) -> SearchQuery:
        text = " ".join(text.split())[:QUERY_CHARS]
        pieces = tuple(dict.fromkeys(piece.lower() for piece in text.split()))[:MAX_TERMS]
        words = tuple(dict.fromkeys(word.lower() for word in re.findall(r"[^\W_]+", text)))[:MAX_TERMS]
        return cls(text=text, words=words, pieces=pieces)

    @property
    def tsquery(self) -> str:
        """The words as a ``to_tsquery`` text: each a prefix, all required. Only letters and digits go in."""
        return " & ".join(f"{word}:*" for word in self.words)

    def __bool__(self) -> bool:
        return bool(self.pieces)


def _like(piece: str) -> str:
    return "%" + piece.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def trigram_available() -> bool:
    """Whether the database has ``pg_trgm`` (the embedded Postgres has not)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm')")
        row = cursor.fetchone()
    return bool(row and row[0])


COLUMNS = {"title": "s.title", "message": "t.words", "reply": "t.reply_text"}
# Stored by Postgres beside each text (migration 0011): to_tsvector('simple', left(text, FTS_CHARS)).
VECTORS = {"title": "s.title_fts", "message": "t.words_fts", "reply": "t.reply_fts"}


def _exact(query: SearchQuery) -> tuple[dict[str, str], dict[str, str]]:
    """Where each field holds every word (as a word or a word's beginning), and the rank of such a match."""
    if not query.words:
        return {name: "false" for name in FIELDS}, {name: "0" for name in FIELDS}
    tsquery = "to_tsquery('simple'::regconfig, %(tsquery)s)"
    return (
        {name: f"{vector} @@ {tsquery}" for name, vector in VECTORS.items()},
        {name: f"ts_rank({vector}, {tsquery})" for name, vector in VECTORS.items()},
    )


def _partial(query: SearchQuery, *, params: dict[str, str | int]) -> tuple[dict[str, str], dict[str, str]]:
    """Where each field holds every piece of the query anywhere, inside words too (``ILIKE``)."""
    for index, piece in enumerate(query.pieces):
        params[f"like{index}"] = _like(piece)
    likes = [f"like{index}" for index in range(len(query.pieces))]
    return (
        {
            name: "(" + " AND ".join(f"{column} ILIKE %({like})s" for like in likes) + ")"
            for name, column in COLUMNS.items()
        },
        {name: str(PARTIAL_RANK) for name in FIELDS},
    )


def _documents(match: dict[str, str], rank: dict[str, str], *, filters: str) -> str:
    """The titles, messages and replies of the owner's sessions that ``match`` (by field), with their rank."""
    session_table = ChatSession._meta.db_table
    turn_table = Turn._meta.db_table
    owned = f"s.owner_id = %(owner)s AND s.deleted_at IS NULL{filters}"
    live = "t.status <> %(taken_back)s"
    return f"""
    SELECT s.id AS session_id, NULL::integer AS turn_id, 'title' AS field, {rank["title"]} * {TITLE_WEIGHT} AS rank
    FROM {session_table} s
    WHERE {owned} AND {match["title"]}
  UNION ALL
    SELECT t.session_id, t.id, 'message', {rank["message"]}
    FROM {turn_table} t JOIN {session_table} s ON s.id = t.session_id
    WHERE {owned} AND {live} AND {match["message"]}
  UNION ALL
    SELECT t.session_id, t.id, 'reply', {rank["reply"]}
    FROM {turn_table} t JOIN {session_table} s ON s.id = t.session_id
    WHERE {owned} AND {live} AND {match["reply"]}"""


def _search_sql(query: SearchQuery, *, trigram: bool, filters: str, params: dict[str, str | int]) -> str:
    """Whole words first; only where none match, pieces inside words; only where neither, similar words."""
    session_table = ChatSession._meta.db_table
    turn_table = Turn._meta.db_table
    exact = _documents(*_exact(query), filters=filters)
    partial = _documents(*_partial(query, params=params), filters=filters)
    hits = "SELECT * FROM exact UNION ALL SELECT * FROM partial WHERE NOT EXISTS (SELECT 1 FROM exact)"
    fuzzy = ""
    if trigram and len(query.text) >= FUZZY_MIN_CHARS:
        similar = {name: f"%(text)s <%% {column}" for name, column in COLUMNS.items()}
        ranks = {name: f"word_similarity(%(text)s, {column}) * {PARTIAL_RANK}" for name, column in COLUMNS.items()}
        fuzzy = f",\nfuzzy AS ({_documents(similar, ranks, filters=filters)}\n)"
        hits += (
            " UNION ALL SELECT * FROM fuzzy"
            " WHERE NOT EXISTS (SELECT 1 FROM exact) AND NOT EXISTS (SELECT 1 FROM partial)"
        )
    first_piece = "lower(%(first)s)"
    window = (
        "substr({body}, greatest(1, coalesce(nullif(strpos(lower({body}), "
        + first_piece
        + f"), 0), 1) - {SNIPPET_BEFORE}), {SNIPPET_CHARS})"
    )
    starts = "greatest(1, coalesce(nullif(strpos(lower({body}), " + first_piece + f"), 0), 1) - {SNIPPET_BEFORE})"
    return f"""
WITH exact AS ({exact}
),
partial AS ({partial}
){fuzzy},
hits AS ({hits}),
totals AS (
    SELECT session_id, sum(rank) AS score, count(*) AS hits FROM hits GROUP BY session_id
    ORDER BY score DESC LIMIT {SEARCH_LIMIT}
),
best AS (
    SELECT DISTINCT ON (h.session_id) h.session_id, h.turn_id, h.field
    FROM hits h JOIN totals USING (session_id)
    ORDER BY h.session_id, h.field = 'title', h.rank DESC, h.turn_id DESC NULLS LAST
)
SELECT b.session_id, b.field, tt.position, totals.score, totals.hits,
    CASE b.field
        WHEN 'title' THEN {window.format(body="s.title")}
        WHEN 'message' THEN {window.format(body="tt.words")}
        ELSE {window.format(body="tt.reply_text")}
    END AS snippet,
    CASE b.field
        WHEN 'title' THEN {starts.format(body="s.title")}
        WHEN 'message' THEN {starts.format(body="tt.words")}
        ELSE {starts.format(body="tt.reply_text")}
    END AS snippet_start,
    CASE b.field
        WHEN 'title' THEN length(s.title)
        WHEN 'message' THEN length(tt.words)
        ELSE length(tt.reply_text)
    END AS body_chars
FROM best b
JOIN totals USING (session_id)
JOIN {session_table} s ON s.id = b.session_id
LEFT JOIN {turn_table} tt ON tt.id = b.turn_id
ORDER BY totals.score DESC, s.updated_at DESC, s.id DESC
"""


def snippet_parts(text: str, pieces: tuple[str, ...], *, cut_before: bool, cut_after: bool) -> tuple[SnippetPart, ...]:
    """``text`` as plain parts and marked ones (where a piece of the query occurs, case ignored); ``…`` where
    the window cuts the text. The parts are text, for the template to escape."""
    text = " ".join(text.split())
    parts: list[SnippetPart] = [SnippetPart("…")] if cut_before else []
    if pieces:
        pattern = re.compile("|".join(re.escape(piece) for piece in sorted(pieces, key=len, reverse=True)), re.I)
        at = 0
        for found in pattern.finditer(text):
            if found.start() > at:
                parts.append(SnippetPart(text[at : found.start()]))
            parts.append(SnippetPart(found.group(), mark=True))
            at = found.end()
        text = text[at:]
    if text:
        parts.append(SnippetPart(text))
    if cut_after:
        parts.append(SnippetPart("…"))
    return tuple(parts)


def session_search(
    *,
    owner: AbstractBaseUser | AnonymousUser,
    text: str,
    workspace_id: int | None = None,
    model_name: str = "",
    trigram: bool | None = None,
) -> list[SearchHit]:
    """The owner's sessions that match ``text`` (best first, at most :data:`SEARCH_LIMIT`), optionally on one
    workspace or one model. ``trigram`` None: use ``pg_trgm`` where the database has it."""
    query = SearchQuery.parse(text)
    if not query or owner.pk is None:
        return []
    if trigram is None:
        trigram = trigram_available()
    params: dict[str, str | int] = {
        "owner": owner.pk,
        "taken_back": TurnStatus.TAKEN_BACK.value,
        "tsquery": query.tsquery,
        "text": query.text,
        "first": query.pieces[0],
    }
    filters = ""
    if workspace_id is not None:
        filters += " AND s.workspace_id = %(workspace)s"
        params["workspace"] = workspace_id
    if model_name:
        filters += " AND s.model_name = %(model)s"
        params["model"] = model_name
    sql = _search_sql(query, trigram=trigram, filters=filters, params=params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    sessions = ChatSession.objects.filter(owner_id=owner.pk, pk__in=[row[0] for row in rows]).select_related(
        "workspace", "endpoint"
    )
    by_id = {session.pk: session for session in sessions}
    hits: list[SearchHit] = []
    for session_id, field_name, position, score, count, snippet, start, chars in rows:
        session = by_id.get(session_id)
        if session is None:
            continue
        snippet = snippet or ""
        parts = snippet_parts(
            snippet, query.pieces, cut_before=start > 1, cut_after=start - 1 + len(snippet) < (chars or 0)
        )
        hits.append(SearchHit(session, field_name, position, float(score), int(count), parts))
    return hits
