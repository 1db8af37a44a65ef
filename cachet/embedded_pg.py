"""The embedded Postgres that Cachet starts when ``DATABASE_URL`` is unset."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DATABASE_NAME = "cachet"

_server: Any = None


def embedded_database_url(data_dir: Path) -> str:
    """Start (or reuse) the ``pgserver`` Postgres in ``data_dir/pg`` and return a URL to Cachet's database."""
    global _server
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    import pgserver

    if _server is None:
        pgdata = data_dir / "pg"
        pgdata.mkdir(parents=True, exist_ok=True)
        _server = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        exists = _server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
        if "(1 row)" not in exists:
            logger.info("creating database %s in %s", DATABASE_NAME, pgdata)
            _server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    return str(_server.get_uri(DATABASE_NAME))
