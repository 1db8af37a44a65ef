"""Benchmark: what wrong-password guessing costs everyone else, and what the login limits take back.

Serves Cachet under Daphne (``manage.py serve``, a subprocess on a loopback port, its own embedded
Postgres in a temporary folder) once per configuration and measures, from distinct loopback source
addresses (so each client has its own IP, as on a LAN):

- **probe** (127.0.0.3): 40 wrong passwords for one account, then the right one: which attempt is
  first refused, and whether the right password still logs in;
- **idle**: another person's latency for their session list (``GET /``, 127.0.0.1) with nobody guessing;
- **one account** (127.0.0.2): N concurrent guessers try wrong passwords for one username;
- **rotating** (127.0.0.4): N concurrent guessers try a new username each time (axes' per
  username+address lockout never triggers; only the per-address limit helps).

During each attack the other person keeps loading their session list; the bench prints guesses per
second, how many were answered after a password check (200, the form again) or refused without one
(429/403), and the other person's page latency.

It also reads the server process's CPU time (``/proc/PID/stat``) before and after each attack: the CPU
seconds the server spent per guess do not depend on what else the machine runs.

Configurations: ``before`` turns both limits off (``CACHET_LOGIN_FAILURES=0``,
``CACHET_LOGIN_IP_FAILURES_PER_MINUTE=0``, which is how Cachet behaved before them); ``no-delay`` has both
limits but answers refusals at once (``CACHET_LOGIN_REFUSAL_DELAY=0``); ``after`` keeps the defaults.

    python bench/login_bench.py [--guessers 8] [--seconds 30] [--configs before,no-delay,after]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402

CONFIGS: dict[str, dict[str, str]] = {
    "before": {"CACHET_LOGIN_FAILURES": "0", "CACHET_LOGIN_IP_FAILURES_PER_MINUTE": "0"},
    "no-delay": {"CACHET_LOGIN_REFUSAL_DELAY": "0"},
    "after": {},
}
PASSWORD = "right-password-42"
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
REQUEST_TIMEOUT = 120.0


@dataclass
class Attack:
    seconds: float = 0.0
    cpu: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    @property
    def guesses(self) -> int:
        return sum(self.outcomes.values())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _setup(data: Path) -> None:
    os.environ["CACHET_DATA"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    users = get_user_model()
    for name in ("victim", "victim2", "other"):
        if not users.objects.filter(username=name).exists():
            users.objects.create_user(username=name, password=PASSWORD)


def _reset() -> None:
    """Forget recorded login failures between configurations (axes' table, where it exists)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('axes_accessattempt') IS NOT NULL")
        row = cursor.fetchone()
        if row and row[0]:
            cursor.execute("DELETE FROM axes_accessattempt")
    connection.close()


def _serve(data: Path, port: int, extra: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CACHET_DATA": str(data), "LOG_LEVEL": "ERROR", **extra}
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"manage.py serve exited with {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/login/", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.terminate()
    raise RuntimeError("Cachet did not answer on /login/ within 120 s")


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(base: str, source: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=base, transport=transport, timeout=REQUEST_TIMEOUT, follow_redirects=False)


def _token(client: httpx.Client) -> str:
    match = TOKEN.search(client.get("/login/").text)
    if match is None:
        raise RuntimeError("the login page has no CSRF token")
    return match.group(1)


def _attempt(client: httpx.Client, token: str, username: str, password: str) -> str:
    """One login: ``in`` (logged in), ``checked`` (the form again: the password was checked), or the status."""
    response = client.post("/login/", data={"csrfmiddlewaretoken": token, "username": username, "password": password})
    if response.status_code == 302:
        return "in"
    if response.status_code == 200:
        return "checked"
    return str(response.status_code)


def probe(base: str) -> str:
    """40 wrong passwords, then the right one, from one address."""
    with _client(base, "127.0.0.3") as client:
        token = _token(client)
        outcomes = [_attempt(client, token, "victim", f"wrong-{n}") for n in range(40)]
        last = _attempt(client, token, "victim", PASSWORD)
    refused = next((n + 1 for n, outcome in enumerate(outcomes) if outcome != "checked"), None)
    first = f"first refused at attempt {refused} ({outcomes[refused - 1]})" if refused else "none of the 40 refused"
    return f"{first}; the right password after them: {'logged in' if last == 'in' else 'refused ' + last}"


@contextmanager
def _logged_in(base: str) -> Iterator[httpx.Client]:
    with _client(base, "127.0.0.1") as client:
        if _attempt(client, _token(client), "other", PASSWORD) != "in":
            raise RuntimeError("the other person could not log in")
        yield client


def _page_latencies(client: httpx.Client, stop: threading.Event, into: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        response = client.get("/")
        into.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"the session list answered {response.status_code}")
        stop.wait(0.1)


def idle(base: str, count: int = 30) -> list[float]:
    with _logged_in(base) as client:
        client.get("/")
        latencies: list[float] = []
        for _ in range(count):
            started = time.perf_counter()
            client.get("/")
            latencies.append(time.perf_counter() - started)
        return latencies


def attack(base: str, *, pid: int, source: str, rotate: bool, guessers: int, seconds: float) -> Attack:
    result = Attack()
    lock = threading.Lock()
    stop = threading.Event()
    counter = iter(range(10**9))

    def guess() -> None:
        with _client(base, source) as client:
            token = _token(client)
            while not stop.is_set():
                with lock:
                    n = next(counter)
                username = f"nobody-{n}" if rotate else "victim2"
                outcome = _attempt(client, token, username, f"guess-{n}")
                with lock:
                    if not stop.is_set():
                        result.outcomes[outcome] += 1

    with _logged_in(base) as other:
        threads = [threading.Thread(target=guess) for _ in range(guessers)]
        watcher = threading.Thread(target=_page_latencies, args=(other, stop, result.latencies))
        cpu = _cpu_seconds(pid)
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        watcher.start()
        time.sleep(seconds)
        stop.set()
        result.seconds = time.perf_counter() - started
        for thread in [*threads, watcher]:
            thread.join(REQUEST_TIMEOUT)
        result.cpu = _cpu_seconds(pid) - cpu
    return result


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.0f}"


def _row(name: str, config: str, run: Attack) -> str:
    checked = run.outcomes.get("checked", 0)
    refused = run.guesses - checked - run.outcomes.get("in", 0)
    per_guess = 1000 * run.cpu / run.guesses if run.guesses else 0.0
    return (
        f"| {config} | {name} | {run.guesses / run.seconds:.1f} | {checked} | {refused} | "
        f"{run.cpu / run.seconds:.0%} | {per_guess:.1f} | "
        f"{_ms(run.latencies, 0.5)} | {_ms(run.latencies, 0.95)} | {_ms(run.latencies, 1.0)} |"
    )


def main() -> None:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guessers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--configs", default="before,no-delay,after")
    args = parser.parse_args()
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; known: {', '.join(CONFIGS)}")

    rows: list[str] = []
    probes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cachet-login-bench-") as folder:
        data = Path(folder)
        _setup(data)
        for config in names:
            _reset()
            port = _free_port()
            server = _serve(data, port, CONFIGS[config])
            base = f"http://127.0.0.1:{port}"
            try:
                probes.append(f"{config}: {probe(base)}")
                quiet = idle(base)
                rows.append(
                    f"| {config} | nobody guessing | - | - | - | - | - | {_ms(quiet, 0.5)} | {_ms(quiet, 0.95)} | "
                    f"{_ms(quiet, 1.0)} |"
                )
                for name, source, rotate in (("one account", "127.0.0.2", False), ("rotating", "127.0.0.4", True)):
                    run = attack(
                        base, pid=server.pid, source=source, rotate=rotate, guessers=args.guessers, seconds=args.seconds
                    )
                    rows.append(_row(name, config, run))
            finally:
                server.terminate()
                server.wait(30)
    print(f"{args.guessers} concurrent guessers for {args.seconds:.0f} s per attack; PBKDF2 as Django configures it")
    print()
    for line in probes:
        print(f"40 wrong then right, {line}")
    print()
    print(
        "| config | attack | guesses/s | password checked | refused unchecked | server CPU | CPU ms/guess "
        "| other p50 ms | p95 ms | max ms |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for line in rows:
        print(line)


if __name__ == "__main__":
    main()
