"""``manage.py backup FILE``: Cachet's whole database as SQL, by ``pg_dump``, whether Cachet runs or not; on the
embedded Postgres with the ``pg_dump`` that ships with it (started for the dump where it is stopped), on another with
the ``pg_dump`` on the ``PATH``. ``manage.py dbshell -- -X -q -o /dev/null -v ON_ERROR_STOP=1 -f FILE`` loads it
into an empty database."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from cachet.embedded_pg import psql_path

SSL_KEYS = ("sslmode", "sslrootcert", "sslcert", "sslkey")  # passed as libpq's environment (PGSSLMODE, …)


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # serve runs the checks; the URLconf (every web module) is not loaded
    help = "Write Cachet's whole database to FILE as SQL (pg_dump), whether Cachet runs or not."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="where the dump goes (refused where it exists)")

    def handle(self, *args: Any, **options: Any) -> None:
        target = str(options["file"])
        if os.path.exists(target):
            raise CommandError(f"{target} exists; give a new file.")
        connection.ensure_connection()  # the embedded Postgres starts here where it is stopped
        params = connection.get_connection_params()
        embedded = connection.vendor == "postgresql" and connection.settings_dict["ENGINE"] == "cachet.embedded_backend"
        program = str(psql_path().with_name("pg_dump")) if embedded else shutil.which("pg_dump")
        if program is None:
            raise CommandError("pg_dump is not installed here (apt-get install postgresql-client).")
        env = {**os.environ}
        if params.get("password"):
            env["PGPASSWORD"] = str(params["password"])
        argv = [program, "--no-owner", "--file", target]
        flags = {"dbname": "dbname", "user": "username", "host": "host", "port": "port"}
        argv += [f"--{flag}={params[key]}" for key, flag in flags.items() if params.get(key)]
        for key in SSL_KEYS:
            if params.get(key):
                env[f"PG{key.upper()}"] = str(params[key])
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise CommandError(f"pg_dump failed: {done.stderr.strip() or done.returncode}")
        self.stdout.write(f"Wrote the database {params.get('dbname')} to {target} ({os.path.getsize(target):,} bytes).")
