"""A turn's revision moves on at every step of its reply and with every result: while it was indexed, each of
those updates wrote a new entry into every index of the turn, the full-text ones of the person's words and of
the reply included (with a 130 KB message, on the embedded Postgres: 91 KB of WAL and 1.3–1.5 ms a bump).
Unindexed, and with room left on each page, the update stays on its page and touches no index (a HOT update).
What changed after a revision is found among the session's turns by its other indexes: a reconnecting tab's
catch-up reads them once."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0012_break_cause_restart"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="turn", name="sessions_ap_session_7f910e_idx"),
        migrations.RunSQL(
            "ALTER TABLE sessions_app_turn SET (fillfactor = 80)",
            "ALTER TABLE sessions_app_turn RESET (fillfactor)",
        ),
    ]
