"""``manage.py serve`` runs a worker in a process of its own beside Daphne: started again when it dies, stopped
with the server."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from tests.process_kit import cachet_env, start

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _workers(serve_pid: int) -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process(serve_pid).children()
        if child.is_running() and "worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE
    ]


def test_serve_keeps_a_worker_running_and_stops_it_with_itself(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    env = cachet_env(data=data, redis_url=None, CACHET_MODEL_URL="http://127.0.0.1:9/v1")
    serve = start("serve", ["manage.py", "serve", "--port", str(_free_port())], env=env, logs=tmp_path)
    try:
        serve.wait_for(lambda output: "Cachet is serving on" in output and "Worker ready" in output, timeout=90)
        [first] = _workers(serve.popen.pid)
        first.kill()
        serve.wait_for(lambda output: "The worker stopped (exit -9); starting it again" in output)
        serve.wait_for(lambda output: output.count("Worker ready") == 2)
        [second] = _workers(serve.popen.pid)
        assert second.pid != first.pid
        serve.popen.send_signal(signal.SIGINT)
        assert serve.popen.wait(timeout=30) is not None
        deadline = time.monotonic() + 30
        while second.is_running() and second.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the worker outlived the server"
            time.sleep(0.05)
        assert "Worker stopped." in serve.output()
    except BaseException:
        print(serve.output())
        raise
    finally:
        serve.stop(signal.SIGKILL)
