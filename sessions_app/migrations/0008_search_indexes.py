"""Indexes for searching sessions: full-text (GIN over ``to_tsvector('simple', …)``) on titles, the person's words
and replies, and trigram indexes (GIN, ``gin_trgm_ops``) on the same where Postgres offers ``pg_trgm``.

The embedded Postgres (``pgserver``) ships without ``pg_trgm``: there the extension is left out and search falls
back to ``ILIKE`` for partial words."""

from __future__ import annotations

from typing import Any

from django.db import migrations

# Kept equal to sessions_app.selectors.search.FTS_CHARS: a tsvector holds at most 1 MB, the text before it is indexed.
FTS_CHARS = 100_000

FTS_INDEXES = (
    ("session_title_fts", "sessions_app_chatsession", "title"),
    ("turn_words_fts", "sessions_app_turn", "words"),
    ("turn_reply_fts", "sessions_app_turn", "reply_text"),
)
TRIGRAM_INDEXES = (
    ("session_title_trgm", "sessions_app_chatsession", "title"),
    ("turn_words_trgm", "sessions_app_turn", "words"),
    ("turn_reply_trgm", "sessions_app_turn", "reply_text"),
)


def _trigram_create(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        cursor.execute("SAVEPOINT cachet_trgm")
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except Exception:  # noqa: BLE001 - no right to create it: search uses ILIKE instead
            cursor.execute("ROLLBACK TO SAVEPOINT cachet_trgm")
            return
        cursor.execute("RELEASE SAVEPOINT cachet_trgm")
        for name, table, column in TRIGRAM_INDEXES:
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} USING gin ({column} gin_trgm_ops)")


def _trigram_drop(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        for name, _, _ in TRIGRAM_INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0007_turn_note_workspace_model"),
    ]

    operations = [
        *(
            migrations.RunSQL(
                f"CREATE INDEX {name} ON {table} USING gin (to_tsvector('simple'::regconfig, left({column}, {FTS_CHARS})))",
                f"DROP INDEX IF EXISTS {name}",
            )
            for name, table, column in FTS_INDEXES
        ),
        migrations.RunPython(_trigram_create, _trigram_drop),
    ]
