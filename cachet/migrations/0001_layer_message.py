"""The table of channel layer messages too large for a notification (``cachet.pg_layer``): unlogged, as its rows
live a minute and need not survive a crash."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.RunSQL(
            "CREATE UNLOGGED TABLE cachet_layer_message ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " expires timestamptz NOT NULL,"
            " body text NOT NULL)",
            "DROP TABLE cachet_layer_message",
        )
    ]
