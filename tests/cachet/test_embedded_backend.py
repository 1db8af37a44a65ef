"""The settings start nothing; the embedded Postgres starts on a process's first database connection, and
again on the next one when it has stopped. Each case runs Cachet in subprocesses on a fresh ``CACHET_DATA``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)


def _postgres_on(data: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and any(str(data) in part for part in cmdline):
            found.append(process)
    return found


@pytest.fixture
def data() -> Iterator[Path]:
    """A fresh ``CACHET_DATA`` (not made yet); any Postgres left running on it is stopped afterwards.

    Not under pytest's ``tmp_path``: as root, Postgres runs as the ``pgserver`` user, which must traverse the
    folders above its data, and pytest keeps ``/tmp/pytest-of-root`` closed to other users.
    """
    parent = Path(tempfile.mkdtemp(prefix="cachet-embedded-test-"))
    folder = parent / "cachet-data"
    try:
        yield folder
    finally:
        for process in _postgres_on(folder):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
                process.wait(10)
        shutil.rmtree(parent, ignore_errors=True)


def _environment(data: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "SECRET_KEY", "XDG_RUNTIME_DIR", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"}
    }
    env.update(CACHET_DATA=str(data), DJANGO_SETTINGS_MODULE="cachet.settings", PYTHONPATH=str(ROOT))
    return env


def _run(data: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=_environment(data),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_settings_help_check_and_test_collection_start_nothing_and_write_nothing(data: Path) -> None:
    setup = _run(
        data,
        "-c",
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.DATABASES['default']['ENGINE'])",
    )
    assert setup.stdout.strip() == "cachet.embedded_backend"
    _run(data, "manage.py", "help")
    _run(data, "manage.py", "check")
    _run(data, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/sessions_app/test_text.py")
    assert not data.exists(), sorted(str(path) for path in data.rglob("*"))
    assert _postgres_on(data) == []


def test_the_secret_key_is_generated_on_first_use_once(data: Path) -> None:
    read = "import django; django.setup(); from django.conf import settings; print(str(settings.SECRET_KEY))"
    first = _run(data, "-c", read).stdout.strip()
    second = _run(data, "-c", read).stdout.strip()
    assert len(first) >= 50 and first == second
    key_file = data / "secret_key"
    assert key_file.read_text().strip() == first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert sorted(path.name for path in data.iterdir()) == ["secret_key"]


def test_conformance_runs_on_a_fresh_checkout_before_anything_else_made_its_tables(data: Path) -> None:
    cases = data.parent / "one.json"
    read = {"tool": "read", "args": {"path": "a.txt"}, "expect_contains": ["[#0001 a.txt lines 1-1"]}
    case = {"name": "one", "spec": "§1", "workspace": {"a.txt": "a\n"}, "steps": [{"user": "hi"}, read]}
    cases.write_text(json.dumps({"format": 1, "cases": [case]}))
    done = _run(data, "manage.py", "conformance", str(cases), timeout=240)
    assert done.stdout.splitlines() == ["ok one", "1 passed, 0 failed"], done.stderr


def test_migrate_starts_the_embedded_postgres_and_a_stopped_one_starts_again(data: Path) -> None:
    migrate = _run(data, "manage.py", "migrate", "-v", "0", timeout=240)
    assert (data / "pg" / "PG_VERSION").exists(), migrate.stderr
    shell = _run(data, "manage.py", "dbshell", "--", "-At", "-c", "SELECT count(*) > 0 FROM django_migrations")
    assert shell.stdout.strip() == "t"
    restart = _run(
        data,
        "-c",
        "import django, subprocess; django.setup()\n"
        "from django.db import connection\n"
        "from cachet.embedded_pg import _servers\n"
        "def pid():\n"
        "    with connection.cursor() as c:\n"
        "        c.execute('SELECT pg_backend_pid(), count(*) FROM sessions_app_chatsession')\n"
        "    return next(iter(_servers.values())).get_postmaster_info().pid\n"
        "before = pid()\n"
        "from pgserver._commands import POSTGRES_BIN_PATH\n"
        "server = next(iter(_servers.values()))\n"
        "subprocess.run([str(POSTGRES_BIN_PATH / 'pg_ctl'), '-D', str(server.pgdata), '-m', 'fast', '-w', 'stop'],"
        " user=server.system_user, check=True, capture_output=True)\n"
        "connection.close()\n"
        "print(before, pid())\n",
    )
    before, after = restart.stdout.split()
    assert before != after
    # The last process out stops the server; a thread of it still connecting (the channel layer's, say) does not
    # start it again on the way out (that left a Postgres running after every process had exited).
    _run(
        data,
        "-c",
        "import django, threading, time; django.setup()\n"
        "from django.db import connection, connections\n"
        "connection.ensure_connection()\n"
        "def connecting():\n"
        "    while True:\n"
        "        try:\n"
        "            connections['default'].close()\n"
        "            connections['default'].ensure_connection()\n"
        "        except Exception:\n"
        "            pass\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=connecting, daemon=True).start()\n"
        "time.sleep(0.2)\n",
        timeout=40,  # it took 75 s, restarting the server and waiting for it to stop
    )
    deadline = time.monotonic() + 10
    while _postgres_on(data) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _postgres_on(data), "a Postgres was left running on the data folder"
    # A benchmark removes its data folder when it ends, the server stopped first: removed under it, the server ran
    # on (and the exit's own stop, finding no folder, failed), a Postgres left behind at every run stopped early.
    stopped = _run(
        data,
        "-c",
        "import django, os, shutil; django.setup()\n"
        "from pathlib import Path\n"
        "from django.db import connections\n"
        "from cachet.embedded_pg import embedded_stop\n"
        "connections['default'].ensure_connection()\n"
        "connections.close_all()\n"
        "embedded_stop(Path(os.environ['CACHET_DATA']))\n"
        "shutil.rmtree(os.environ['CACHET_DATA'])\n",
    )
    assert not _postgres_on(data) and not data.exists() and "Traceback" not in stopped.stderr, stopped.stderr


def test_processes_that_start_at_once_share_one_server_and_one_database(data: Path) -> None:
    """Two test workers, or a web process and a worker, connect first at the same moment: one starts the server
    and makes the database, the others wait for it (two ``CREATE DATABASE`` at once failed one of them)."""
    ask = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SELECT current_database()')\n"
        "    print(c.fetchone()[0])\n"
    )
    started = [
        subprocess.Popen(
            [sys.executable, "-c", ask],
            cwd=ROOT,
            env=_environment(data),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120) for process in started]
    assert [process.returncode for process in started] == [0, 0, 0], [err for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["cachet"] * 3
