"""Starting and stopping ``manage.py serve`` as ``./run`` does, on the embedded Postgres of a fresh data folder:
SIGTERM and SIGINT alike stop every worker it started (one it started again after a ``kill -9`` too) and the
embedded Postgres. And two ``serve --no-worker`` started at once on a fresh database both serve (the migrations
run under an advisory lock, one process at a time)."""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from django.db import connection

from tests import process_kit
from tests.process_kit import Process, cachet_env, start

pytestmark = pytest.mark.django_db(transaction=True)

LISTENING = re.compile(r"Listening on TCP address [\d.]+:(\d+)")


def _postgres_on(data: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and any(str(data) in part for part in cmdline):
            found.append(process)
    return found


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _workers(serve: Process) -> list[psutil.Process]:
    return [child for child in psutil.Process(serve.popen.pid).children() if "worker" in child.cmdline()]


@pytest.fixture
def data() -> Iterator[Path]:
    """A fresh ``CACHET_DATA``, not under pytest's folder (as root, the embedded Postgres runs as ``pgserver``,
    which must traverse the folders above its data); what is left running on it is stopped afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="cachet-serve-stop-"))
    parent.chmod(0o755)
    folder = parent / "data"
    try:
        yield folder
    finally:
        for process in _postgres_on(folder):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
                process.wait(10)
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_its_workers_restarted_ones_too_and_the_embedded_postgres(
    data: Path, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    env = cachet_env(data=data, redis_url=None, CACHET_MODEL_URL="http://127.0.0.1:9/v1")
    del env["DATABASE_URL"]  # the embedded Postgres, as ./run has it
    env.pop("XDG_RUNTIME_DIR", None)
    serve = start("serve", ["manage.py", "serve", "--port", "0"], env=env, logs=tmp_path)
    try:
        serve.wait_for(lambda output: "Cachet is serving on" in output and "Worker ready" in output, timeout=120)
        assert _postgres_on(data), "the embedded Postgres runs"
        [first] = _workers(serve)
        first.kill()
        serve.wait_for(lambda output: output.count("Worker ready") == 2)
        [second] = _workers(serve)
        assert second.pid != first.pid
        serve.popen.send_signal(stop_signal)  # to serve alone, as systemd or a shell's kill sends it
        assert serve.popen.wait(timeout=40) is not None
        deadline = time.monotonic() + 10
        while (_alive(second) or _postgres_on(data)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(second), "the worker serve had started again outlived it"
        assert not _postgres_on(data), "the embedded Postgres outlived serve"
        assert "Worker stopped." in serve.output()
    except BaseException:
        print(serve.output())
        raise
    finally:
        for process in _workers(serve) if serve.popen.poll() is None else []:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        serve.stop(signal.SIGKILL)


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """A new, empty database on the tests' Postgres, its URL; dropped afterwards."""
    name = f"cachet_fresh_{secrets.token_hex(4)}"
    url = process_kit.test_database_url()
    admin = psycopg.connect(**{**connection.get_connection_params(), "dbname": "postgres"}, autocommit=True)
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        yield url.replace(f"/{connection.settings_dict['NAME']}", f"/{name}", 1)
    finally:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def test_two_web_processes_started_at_once_on_a_fresh_database_both_serve(fresh_database: str, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    env = cachet_env(
        data=tmp_path / "data", redis_url=None, DATABASE_URL=fresh_database, CACHET_MODEL_URL="http://127.0.0.1:9/v1"
    )
    command = ["manage.py", "serve", "--no-worker", "--port", "0"]
    both = [start(f"web-{number}", command, env=env, logs=tmp_path) for number in (1, 2)]
    try:
        for web in both:
            web.wait_for(lambda output: LISTENING.search(output) is not None, timeout=120)
        assert [web.popen.poll() for web in both] == [None, None]
        outputs = [web.output() for web in both]
        assert sum("Created the admin account" in output for output in outputs) == 1, outputs
    except BaseException:
        for web in both:
            print(f"===== {web.name} =====\n{web.output()}")
        raise
    finally:
        for web in both:
            web.stop()


def test_a_worker_stops_when_the_serve_that_started_it_is_killed(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    env = cachet_env(data=tmp_path / "data", redis_url=None, CACHET_MODEL_URL="http://127.0.0.1:9/v1")
    serve = start("serve", ["manage.py", "serve", "--port", "0"], env=env, logs=tmp_path)
    workers: list[psutil.Process] = []
    try:
        serve.wait_for(lambda output: "Worker ready" in output, timeout=120)
        [worker] = workers = _workers(serve)
        serve.popen.kill()  # serve itself, without a chance to stop anything
        serve.popen.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the worker of a killed serve went on taking jobs"
        assert "Worker stopped." in serve.output()
    finally:
        for process in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        serve.stop(signal.SIGKILL)
