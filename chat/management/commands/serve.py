"""``manage.py serve``: migrate, seed what the environment configures, say whether each model endpoint
answers, then run Cachet: Daphne in this process and a worker (``manage.py worker``) in a process of its own,
started again when it dies. Ctrl-C and SIGTERM alike stop both (a worker started again too), and the embedded
Postgres when this process started it. Processes that start together migrate and seed one at a time (an advisory
lock), so none of them fails for the other's tables."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from chat.agent.budget import Window, endpoint_window
from chat.agent.endpoints import EndpointModels, endpoints_models
from chat.agent.workspace import commands_folder_line
from chat.management.commands.worker import SUPERVISOR_ENV
from chat.tasks import mcp_server_check
from chat.web.lan import WILDCARDS, machine_names
from sessions_app.folders import workspace_roots
from sessions_app.models import DEFAULT_ENDPOINT_NAME, McpServer, ModelEndpoint, Workspace
from sessions_app.selectors.sessions import endpoint_list
from sessions_app.services.locks import orphans_interrupt
from sessions_app.services.setup import admin_seed, endpoint_seed, workspaces_seed
from sessions_app.services.workspaces import private_folders_close

STARTUP_LIST_TIMEOUT = 3.0
WORKER_STOP_SECONDS = 20.0  # a stopping worker's replies get its own 10 s, then it is killed
RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)  # after a worker that died within a minute of its start
SETUP_LOCK = (7356, 1)  # the advisory lock held while a process migrates and seeds (7355 is the sessions')
LISTEN_BACKLOG = 1024  # connections the kernel holds for Daphne to accept (Twisted's default, 50, dropped the rest)
# How long a websocket's opening may take before Daphne gives up on it. Daphne's 5 s dropped tabs that opened
# together (a team reloading after a restart): each waited behind the others' session lookups, and the work done
# for those dropped was lost, so of 150 opened at once 11 got through. A tab waits this long instead.
WEBSOCKET_OPEN_SECONDS = 60


class SupervisedWorker:
    """``manage.py worker`` in a process of its own, started again whenever it ends while this one serves."""

    def __init__(self, *, say: IO[str]) -> None:
        self.say = say
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.starts = 0
        self._lock = threading.Lock()  # a worker is started, or the stop takes the one there is: never both at once
        self._thread = threading.Thread(target=self._supervise, name="cachet-worker-supervisor", daemon=True)

    def _start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
        return subprocess.Popen([sys.executable, str(settings.BASE_DIR / "manage.py"), "worker"], env=env)

    def _supervise(self) -> None:
        quick_deaths = 0
        while True:
            with self._lock:
                if self.stopping.is_set():
                    return
                started = time.monotonic()
                process = self.process = self._start()
            code = process.wait()
            if self.stopping.is_set():
                return
            quick_deaths = quick_deaths + 1 if time.monotonic() - started < 60 else 0
            delay = RESTART_DELAYS[min(quick_deaths, len(RESTART_DELAYS)) - 1] if quick_deaths else 0.0
            self.say.write(f"The worker stopped (exit {code}); starting it again in {delay:g} s.\n")
            self.say.flush()
            if self.stopping.wait(delay):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker running now, whichever start it is, and start no other."""
        with self._lock:
            self.stopping.set()
            process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(WORKER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                self.say.write(f"The worker did not stop within {WORKER_STOP_SECONDS:g} s; killed it.\n")
                self.say.flush()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def supervised_worker(*, say: IO[str]) -> Iterator[SupervisedWorker]:
    """A worker process for as long as the block runs."""
    supervised = SupervisedWorker(say=say)
    supervised.start()
    try:
        yield supervised
    finally:
        supervised.stop()


@contextlib.contextmanager
def setup_lock() -> Iterator[None]:
    """Held while this process migrates and seeds, on a connection of its own: processes that start together on
    one database take turns (two at once on a fresh database had one fail in ``migrate``, every time)."""
    holder = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", list(SETUP_LOCK))
        yield
    finally:
        holder.close()  # the lock goes with the connection


def _quiet_stop() -> None:
    """SIGINT and SIGTERM are not heard again while this process stops what it started (its worker has its own
    20 s): a second Ctrl-C or ``kill`` must not leave the worker or the embedded Postgres behind."""
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.SIG_IGN)


def daphne(*, host: str, port: int) -> None:
    """Serve Cachet under Daphne (``chat.web.daphne_server``'s, with its limits) until SIGINT or SIGTERM, with room
    for many connections at once: ``LISTEN_BACKLOG`` and ``WEBSOCKET_OPEN_SECONDS``."""
    from daphne.cli import CommandLineInterface

    from chat.web.daphne_server import CachetServer  # installs Twisted's reactor: only now

    class CommandLine(CommandLineInterface):  # type: ignore[misc]
        server_class = CachetServer

    logging.getLogger("daphne.server").addFilter(lambda record: not record.getMessage().startswith("HTTP/2 support"))
    interface = host.strip("[]").replace(":", r"\:")
    limit = str(settings.CACHET_MAX_FRAME_BYTES)
    CommandLine().run(
        [
            *("--endpoint", f"tcp:port={port}:interface={interface}:backlog={LISTEN_BACKLOG}"),
            *("--websocket_connect_timeout", str(WEBSOCKET_OPEN_SECONDS)),
            *("--websocket-max-message-size", limit, "--websocket-max-frame-size", limit),
            "cachet.asgi:application",
        ]
    )


def lan_names_line(names: list[str], port: int, *, chosen: bool) -> str:
    """What a server bound to every address is reached at, and whose names it answers."""
    urls = ", ".join(f"http://{name}:{port}/" for name in names) or "no address found"
    if chosen:
        return f"Serving every address of this machine ({urls}); it answers the names ALLOWED_HOSTS sets."
    return (
        f"Serving every address of this machine: {urls}. It answers these names and addresses (set ALLOWED_HOSTS "
        "to choose others, a proxy's name for one)."
    )


def endpoint_line(found: EndpointModels) -> str:
    """One line on whether the endpoint's server answers, and what a person can do when it does not."""
    endpoint, listing = found.endpoint, found.listing
    head = f"Model endpoint {endpoint.name}: {endpoint.base_url}"
    if listing.listed:
        return f"{head} answers, models: {', '.join(listing.models) or 'none listed'}"
    where = (
        "Set CACHET_MODEL_URL or change it in the admin."
        if endpoint.name == DEFAULT_ENDPOINT_NAME
        else "Change it in the admin."
    )
    if listing.answered:
        return f"{head} answers but lists no models ({listing.problem}); sessions on it may fail. {where}"
    return f"{head} does not answer ({listing.problem}); sessions on it will fail until it does. {where}"


def window_line(found: EndpointModels, window: Window) -> str:
    """The context window an endpoint's sessions are measured against, and where it comes from."""
    head = f"Model endpoint {found.endpoint.name}: context window {window.tokens:,} tokens"
    if window.read:
        where = f"{window.how}; " if window.how else ""
        return f"{head}, read from the server ({where}configured {window.configured:,})"
    return f"{head}, as configured (the server does not say its own)"


def images_line(endpoint: ModelEndpoint) -> str:
    """That an endpoint's model reads images, and who says so."""
    said = endpoint.server_reads_images is not None and endpoint.server_window_url == endpoint.base_url
    where = "the server says so at /props" if said else "as set in the admin"
    return f"Model endpoint {endpoint.name}: its model reads images ({where}): attached images go with messages"


SETTINGS_HELP = """settings (environment variables; docs/deployment.md lists them all):
  CACHET_MODEL_URL        the default endpoint's URL, set at every start where given (else kept as set in the admin)
  CACHET_MODEL            its model (else the first its server lists)
  CACHET_DATA             Cachet's data folder: the embedded Postgres, the secret key, workspaces (./.cachet)
  DATABASE_URL            another Postgres instead of the embedded one
  REDIS_URL               Redis as the channel layer and cache (else Postgres's LISTEN/NOTIFY)
  CACHET_WORKSPACES       name=/folder,... shared workspaces made or updated at start
  CACHET_WORKSPACE_ROOTS  the folders workspace folders must lie under ($CACHET_DATA/workspaces)
  ALLOWED_HOSTS           the names Cachet answers to; CSRF_TRUSTED_ORIGINS the origins it takes forms from
  CACHET_TLS              1 behind a proxy that serves https
  CACHET_PROXY_COUNT      the trusted proxies in front: the client's address is the one they forward (0)
  CACHET_WORKER_CONCURRENCY  replies a worker runs at once (16)
  CACHET_METRICS_TOKEN    turns on /metrics for Prometheus, answered to this bearer token (off)
  CACHET_OIDC_CLIENT_ID   turns on sign-in with an OpenID Connect provider (off), with CACHET_OIDC_ISSUER and
                          CACHET_OIDC_CLIENT_SECRET, CACHET_OIDC_LABEL, CACHET_OIDC_SCOPES, CACHET_OIDC_SIGN_ALGO,
                          CACHET_OIDC_GROUPS_CLAIM, CACHET_OIDC_GROUP_MAP, CACHET_OIDC_STAFF_GROUPS
  CACHET_LDAP_URI         turns on sign-in with LDAP or Active Directory (off), with CACHET_LDAP_USER_BASE (or
                          CACHET_LDAP_USER_DN_TEMPLATE) and CACHET_LDAP_USER_FILTER, CACHET_LDAP_BIND_DN,
                          CACHET_LDAP_BIND_PASSWORD, CACHET_LDAP_START_TLS, CACHET_LDAP_GROUP_BASE,
                          CACHET_LDAP_GROUP_TYPE, CACHET_LDAP_GROUP_FILTER, CACHET_LDAP_GROUP_MAP,
                          CACHET_LDAP_STAFF_GROUPS"""


class Command(BaseCommand):
    help = (
        "Migrate, seed workspaces, the default model endpoint and the first admin, say whether each model "
        "endpoint answers, then serve under Daphne."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Django's parser, its help ending with the settings people set most (``./run --help``)."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = SETTINGS_HELP
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            default=os.environ.get("CACHET_HOST", "127.0.0.1"),
            help="the address to serve (CACHET_HOST; 0.0.0.0: every address, the LAN's too)",
        )
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("CACHET_PORT", "8000")), help="the port (CACHET_PORT)"
        )
        parser.add_argument("--no-serve", action="store_true", help="set up, then exit without serving")
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="serve pages only; replies run in workers started elsewhere (manage.py worker)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        main = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGTERM, signal.default_int_handler) if main else None  # as Ctrl-C until Daphne
        try:
            self._serve(**options)
        except KeyboardInterrupt:
            _quiet_stop()
        finally:
            if before is not None and options["no_serve"]:  # called in a process that goes on (a test, a script)
                signal.signal(signal.SIGTERM, before)

    def _serve(self, **options: Any) -> None:
        with setup_lock():
            password, endpoint = self._set_up()
        url = f"http://{options['host']}:{options['port']}/"
        if options["host"] in WILDCARDS:
            url = self._every_address(options["port"]) or url
        listings = endpoints_models(endpoint_list(), timeout=STARTUP_LIST_TIMEOUT, kept=0)
        listed = any(found.endpoint.pk == endpoint.pk and found.listing.listed for found in listings)
        self.stdout.write(
            f"Model endpoint {endpoint.name}: {endpoint.base_url} "
            + (endpoint.model or ("(from /v1/models)" if listed else "(from /v1/models once it answers)"))
        )
        for found in listings:
            line = endpoint_line(found)
            self.stdout.write(line if found.listing.listed else self.style.WARNING(line))
            if found.listing.answered:
                self.stdout.write(window_line(found, endpoint_window(found.endpoint, refresh=True)))
                if found.endpoint.images_read:
                    self.stdout.write(images_line(found.endpoint))
        for server_id in McpServer.objects.filter(enabled=True).values_list("pk", flat=True):
            mcp_server_check.defer(server_id=server_id)  # the worker asks each for its tools, as they are now
        if password is not None:
            self.stdout.write(
                self.style.SUCCESS(f"Created the admin account. Log in at {url} as admin with password {password}")
            )
            self.stdout.write(f"Change it with: {_python()} manage.py changepassword admin")
        if options["no_serve"]:
            return
        self.stdout.write(f"Cachet is serving on {url}")
        self.stdout.flush()
        if options["no_worker"]:
            daphne(host=options["host"], port=options["port"])
            return
        with supervised_worker(say=sys.stderr):
            try:
                daphne(host=options["host"], port=options["port"])
            finally:
                _quiet_stop()

    def _every_address(self, port: int) -> str | None:
        """Where ``--host`` is every address: without ``ALLOWED_HOSTS`` in the environment, this run answers the
        machine's own names and addresses too (Django answered 400 to any other); said in a line. The first of
        them, as a URL."""
        names = machine_names()
        chosen = "ALLOWED_HOSTS" in os.environ
        if not chosen:
            settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, *names]
        self.stdout.write(lan_names_line(names, port, chosen=chosen))
        return f"http://{names[0]}:{port}/" if names and not chosen else None

    def _set_up(self) -> tuple[str | None, Any]:
        """Migrate, collect the static files, seed, and mark interrupted what a stopped server left; the admin's
        new password (``None`` when there was one) and the default endpoint."""
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        roots = workspace_roots() or [settings.CACHET_DATA / "workspaces"]
        seeded = workspaces_seed(spec=settings.CACHET_WORKSPACES, default_folder=roots[0] / "scratch")
        for refused in seeded.refused:  # the others are seeded and Cachet serves: one bad folder stops nothing else
            self.stderr.write(
                f"Workspace {refused.name}: not seeded, Cachet may not use {refused.folder} ({refused.reason})."
            )
        endpoint = endpoint_seed(
            base_url=settings.CACHET_MODEL_URL, model=settings.CACHET_MODEL, first_url=settings.CACHET_DEFAULT_MODEL_URL
        )
        password = admin_seed()
        interrupted = orphans_interrupt()
        if interrupted:
            self.stdout.write(
                f"Marked interrupted the open replies of {len(interrupted)} session(s) of a stopped server."
            )
        for workspace in Workspace.objects.filter(owner__isnull=True).order_by("name"):
            self.stdout.write(f"Workspace {workspace.name}: {workspace.folder}")
        private_folders_close()  # folders made before they were closed to other local accounts
        private = Workspace.objects.filter(owner__isnull=False).count()
        if private:
            self.stdout.write(f"Private workspaces: {private}, one for each person who has used Cachet.")
        for workspace in Workspace.objects.order_by("name"):  # as root: who its commands run as, and whether they can
            line = commands_folder_line(workspace)
            if line is not None:
                self.stdout.write(line)
        return password, endpoint


def _python() -> str:
    """This Python as a person would type it here: ``.venv/bin/python`` from the project folder."""
    interpreter = Path(sys.executable)
    try:
        return str(interpreter.relative_to(Path.cwd()))
    except ValueError:
        return str(interpreter)
