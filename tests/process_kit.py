"""Cachet processes (Daphne, ``manage.py worker``) as subprocesses on the test database, as a team deploys them:
their environment, and starting and stopping them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

SECRET_KEY = "cachet-processes-test-secret-key-not-for-production"


def test_database_url() -> str:
    """A URL to the database the tests run on (pytest-django's test database), for the subprocesses."""
    params = connection.get_connection_params()  # where the embedded Postgres listens, too
    user = quote(str(params.get("user") or ""), safe="")
    password = quote(str(params.get("password") or ""), safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    name = quote(str(params["dbname"]), safe="")
    host = str(params.get("host") or "")
    port = str(params.get("port") or "")
    if host.startswith("/"):  # a unix socket directory, as the embedded Postgres uses
        query = f"host={quote(host, safe='')}" + (f"&port={port}" if port else "")
        return f"postgresql://{credentials}/{name}?{query}"
    return f"postgresql://{credentials}{host}{':' + port if port else ''}/{name}"


def cachet_env(*, data: Path, redis_url: str | None, **extra: str) -> dict[str, str]:
    """The environment of a Cachet process on the test database (and ``redis_url``'s Redis, where given); ``extra``
    adds to it, or replaces ``DATABASE_URL`` (the test database through a proxy, say)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "CACHET_DATA", "SECRET_KEY", "DEBUG", "PYTEST_CURRENT_TEST"}
    }
    env.update(
        DATABASE_URL=extra.pop("DATABASE_URL", "") or test_database_url(),
        CACHET_DATA=str(data),
        SECRET_KEY=SECRET_KEY,
        DJANGO_SETTINGS_MODULE="cachet.settings",
        PYTHONPATH=os.pathsep.join(filter(None, [str(settings.BASE_DIR), env.get("PYTHONPATH", "")])),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    if "CACHET_WORKSPACE_ROOTS" not in extra:  # the test process's own roots, its temporary folders among them
        roots = [data / "workspaces", *settings.CACHET_WORKSPACE_ROOTS]
        env["CACHET_WORKSPACE_ROOTS"] = ",".join(str(root) for root in roots)
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


@dataclass
class Process:
    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, ready: Callable[[str], bool], *, timeout: float = 45.0) -> None:
        """Wait until the process's output satisfies ``ready``; fail with its output if it ends or is late."""
        deadline = time.monotonic() + timeout
        while not ready(self.output()):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not get ready:\n{self.output()}")
            time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)


def start(name: str, command: list[str], *, env: dict[str, str], logs: Path, url: str = "") -> Process:
    """``command`` run from the project folder in a process group of its own, its output in ``logs/NAME.log``."""
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, *command],
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Process(name, url, popen, log)


def start_worker(name: str, *, env: dict[str, str], logs: Path) -> Process:
    """``manage.py worker``, once it says it is ready."""
    worker = start(name, ["manage.py", "worker"], env=env, logs=logs)
    worker.wait_for(lambda output: "Worker ready" in output)
    return worker
