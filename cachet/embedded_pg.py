"""The embedded Postgres that Cachet uses when ``DATABASE_URL`` is unset: the ``pgserver`` package's server in
``$CACHET_DATA/pg``, started by the first database connection of a process (never by an import) and started
again by the next connection when it has stopped; the last process using it stops it as it exits."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DATABASE_NAME = "cachet"
USER = "postgres"

_lock = threading.Lock()
_servers: dict[Path, Any] = {}


@dataclass
class _Process:
    exiting: bool = False  # this process is exiting: its server may be stopping, and is not started again


_process = _Process()


def _exiting() -> None:
    """This process exits: its server is not started again, and processes that used it and died without saying so
    (killed, or ended by ``os._exit``) are forgotten, so the last one out stops it (``pgserver`` counts its users
    by pid, and one dead pid kept every later exit from stopping the server)."""
    _process.exiting = True
    for server in list(_servers.values()):
        with contextlib.suppress(Exception), server._lock:
            users = server.global_process_id_list
            pids = users.get()
            alive = [pid for pid in pids if pid == os.getpid() or _alive(pid)]
            if alive != pids:
                logger.debug("forgetting the embedded Postgres's users that died: %s", sorted(set(pids) - set(alive)))
                users.put(alive)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


@dataclass(frozen=True)
class EmbeddedServer:
    """Where the embedded server listens: a unix socket directory (``host``) and ``port``."""

    host: str
    port: int
    user: str = USER


def psql_path() -> Path:
    """The ``psql`` shipped with ``pgserver``'s Postgres."""
    from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / "psql"


def embedded_server(data_dir: Path, *, check: bool = True) -> EmbeddedServer:
    """Start (or reuse) the Postgres in ``data_dir/pg`` with Cachet's database in it; once per process and
    thread-safe. With ``check``, a server that has stopped since is started again; without, the address of
    the one this process started is given as it was (connecting costs no look at its process)."""
    pgdata = (data_dir / "pg").resolve()
    with _lock:
        server = _servers.get(pgdata)
        if server is None:
            server = _start(data_dir, pgdata)
            _servers[pgdata] = server
        elif not check:
            return _address(server)
        elif not _running(pgdata):
            if _process.exiting:  # the last process out stops the server; a thread still connecting must not restart it
                raise RuntimeError(f"the embedded Postgres in {pgdata} has stopped as this process exits")
            logger.warning("the embedded Postgres in %s has stopped; starting it again", pgdata)
            with server._lock:
                server.ensure_postgres_running()
        return _address(server)


def embedded_stop(data_dir: Path) -> None:
    """Stop the embedded Postgres of ``data_dir`` that this process started, as its exit would (where no other
    process uses it), so that ``data_dir`` can go: removed first, the server is left running on a deleted folder."""
    pgdata = (data_dir / "pg").resolve()
    with _lock:
        server = _servers.pop(pgdata, None)
    if server is not None:
        atexit.unregister(server._cleanup)
        server.cleanup()


def _address(server: Any) -> EmbeddedServer:
    info = server.get_postmaster_info()
    return EmbeddedServer(host=str(info.socket_dir), port=int(info.port or 5432))


def _running(pgdata: Path) -> bool:
    """Whether a postmaster serves ``pgdata`` now: its pid file is there and names a live, unreaped process."""
    import psutil
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or info.process is None:
        return False
    try:
        return bool(info.process.is_running() and info.process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def import_pgserver(data_dir: Path) -> Any:
    """``pgserver``, imported with its lock folder in ``data_dir/run`` unless ``XDG_RUNTIME_DIR`` names one
    (``pgserver`` reads it at import)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    import pgserver

    return pgserver


@contextlib.contextmanager
def _starting(data_dir: Path) -> Iterator[None]:
    """Held by one process at a time (a lock on ``data_dir/pg.lock``) while it starts the server and makes
    Cachet's database: two processes that start at once (a web process and a worker, two test workers) would
    otherwise both see no database and both create it, and one of them fail."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "pg.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _start(data_dir: Path, pgdata: Path) -> Any:
    pgserver = import_pgserver(data_dir)
    with _starting(data_dir):
        pgdata.mkdir(parents=True, exist_ok=True)
        logger.debug("starting the embedded Postgres in %s", pgdata)
        server = pgserver.get_server(pgdata, cleanup_mode="stop")
        atexit.register(_exiting)  # after pgserver's own: handlers run last in, first out, so this one first
        _ensure_database(_address(server))
    return server


def _ensure_database(server: EmbeddedServer) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=server.host, port=server.port, user=server.user, dbname="postgres", autocommit=True
    ) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone() is None:
            logger.info("creating database %s", DATABASE_NAME)
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
