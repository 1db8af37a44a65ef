"""Stored full-text vectors for searching sessions: ``title_fts`` on sessions, ``words_fts`` and ``reply_fts`` on
turns, each ``to_tsvector('simple', …)`` of the text's first ``FTS_CHARS`` characters, computed by Postgres when
the text is written (generated columns) and GIN-indexed. A search then matches and ranks without parsing any
text again (at 16,000 turns a common word took 5 s when every matching text was parsed per query).

The models do not declare these columns: only the search's SQL reads them, so no other query carries them."""

from __future__ import annotations

from django.db import migrations

# Kept equal to sessions_app.selectors.search.FTS_CHARS.
FTS_CHARS = 100_000

VECTORS = (
    ("sessions_app_chatsession", "title_fts", "title", "session_title_fts"),
    ("sessions_app_turn", "words_fts", "words", "turn_words_fts"),
    ("sessions_app_turn", "reply_fts", "reply_text", "turn_reply_fts"),
)


def _forward(table: str, vector: str, column: str, index: str) -> str:
    return (
        f"DROP INDEX IF EXISTS {index}; "
        f"ALTER TABLE {table} ADD COLUMN {vector} tsvector GENERATED ALWAYS AS "
        f"(to_tsvector('simple'::regconfig, left({column}, {FTS_CHARS}))) STORED; "
        f"CREATE INDEX {index} ON {table} USING gin ({vector})"
    )


def _backward(table: str, vector: str, column: str, index: str) -> str:
    return (
        f"DROP INDEX IF EXISTS {index}; "
        f"ALTER TABLE {table} DROP COLUMN IF EXISTS {vector}; "
        f"CREATE INDEX {index} ON {table} USING gin (to_tsvector('simple'::regconfig, left({column}, {FTS_CHARS})))"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0010_merge_cache_miss"),
    ]

    operations = [migrations.RunSQL(_forward(*vector), _backward(*vector)) for vector in VECTORS]
