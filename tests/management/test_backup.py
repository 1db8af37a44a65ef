"""``manage.py backup FILE`` (the docs' backup of the embedded database, which failed as written with an
``ImportError``): a dump of the whole database, loaded back into an empty one with ``psql -v ON_ERROR_STOP=1 -f``,
as ``manage.py dbshell`` runs it, holds what was stored."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection

from cachet.embedded_pg import psql_path
from sessions_app.models import ModelEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_backup_loads_into_an_empty_database_with_what_was_stored(tmp_path: Path) -> None:
    User.objects.create_user("ada-backup", password="x")
    ModelEndpoint.objects.create(name="backed-up", base_url="http://gpu-box:8080/v1", api_key="sk-kept")
    dump = tmp_path / "backup.sql"
    out = io.StringIO()
    call_command("backup", str(dump), stdout=out)
    assert out.getvalue().startswith(f"Wrote the database {connection.settings_dict['NAME']} to {dump} (")
    with pytest.raises(CommandError, match="exists; give a new file"):
        call_command("backup", str(dump))
    params = connection.get_connection_params()
    address = {key: params[key] for key in ("host", "port", "user", "password") if params.get(key)}
    with psycopg.connect(dbname="postgres", autocommit=True, **address) as admin:
        admin.execute("DROP DATABASE IF EXISTS restored_backup")
        admin.execute("CREATE DATABASE restored_backup")
    try:
        loaded = subprocess.run(
            [
                str(psql_path()),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-f",
                str(dump),
                "--dbname=restored_backup",
                f"--host={address['host']}",
                f"--port={address['port']}",
                f"--username={address['user']}",
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PGPASSWORD": str(address.get("password", ""))},
        )
        assert loaded.returncode == 0, loaded.stderr
        with psycopg.connect(dbname="restored_backup", **address) as restored:
            users = restored.execute("SELECT username FROM auth_user WHERE username = 'ada-backup'").fetchall()
            keys = restored.execute(
                "SELECT api_key FROM sessions_app_modelendpoint WHERE name = 'backed-up'"
            ).fetchall()
            queue = restored.execute("SELECT count(*) FROM procrastinate_jobs").fetchone()
        assert users == [("ada-backup",)] and keys == [("sk-kept",)] and queue is not None
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **address) as admin:
            admin.execute("DROP DATABASE IF EXISTS restored_backup")
