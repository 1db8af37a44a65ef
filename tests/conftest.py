from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.conf import settings
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, connections, transaction
from django.test import TransactionTestCase

from cachet import pg_layer
from chat.tools import tool_list
from sessions_app.models import ChatSession, ModelEndpoint, Workspace
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer
from tests.redis_kit import RedisDatabase, claim_database
from tests.sandbox_kit import for_commands

# The suite's scripted servers answer each request a test expects; the title a first reply asks for is one more,
# so it is off here and in the processes the tests start, and on in the tests of titles (tests/agent/test_titles.py).
os.environ["CACHET_TITLES"] = "0"
settings.CACHET_TITLES = False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), the llama.cpp tests go to one worker, which starts each of
    their servers once (``tests/agent/conftest.py``)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("llama"):
            item.add_marker(pytest.mark.xdist_group("llama"))


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's test database, and before it is dropped, the connections that would stop the drop: the
    one the websocket consumers keep on asgiref's thread for thread-sensitive calls (``chat.web.socket_store``)
    and the Postgres channel layers' own."""
    yield
    SyncToAsync.single_thread_executor.submit(lambda: connection.close()).result(timeout=10)  # that thread's own
    pg_layer.close_all()


@pytest.fixture(scope="session", autouse=True)
def _workspaces_in_the_tests_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workspaces in this test process's temporary folders, as staff may make them: its base folder is one of the
    workspace roots; and the private workspaces are made in a folder of its own, not the checkout's data folder
    (which every test process shares)."""
    from django.conf import settings

    base = tmp_path_factory.getbasetemp().resolve()
    people = base / "people"
    roots, kept_people = settings.CACHET_WORKSPACE_ROOTS, settings.CACHET_PEOPLE
    settings.CACHET_WORKSPACE_ROOTS = [*roots, base]
    settings.CACHET_PEOPLE = people
    try:
        yield
    finally:
        settings.CACHET_WORKSPACE_ROOTS, settings.CACHET_PEOPLE = roots, kept_people


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashes() -> Iterator[None]:
    """Passwords hashed with MD5 in this process: PBKDF2's million rounds cost a quarter of a second to 1.4 s a
    user or a login, and no test is about that cost (bench/login_bench.py measures it). Django's own hashers
    stay listed after it, so a hash made by a Cachet subprocess still checks here; a user that a subprocess
    logs in is given a hash of Django's default kind (:func:`tests.passwords.give_shipped_password`)."""
    from django.conf import global_settings
    from django.test.utils import override_settings

    hashers = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]
    with override_settings(PASSWORD_HASHERS=hashers):
        yield


def _empty_the_tables(self: TransactionTestCase) -> None:
    """A transactional test's teardown: every table emptied, as Django's ``flush`` does, but by ``DELETE``
    in one transaction (the foreign keys are deferred) instead of ``TRUNCATE``, which makes new files for
    each of the thirty tables, about 60 ms a test against 5 ms. Content types and permissions stay: the flush
    empties them and its ``post_migrate`` makes the same rows again, another 30 ms."""
    kept = {ContentType._meta.db_table, Permission._meta.db_table}
    names: list[str] = self._databases_names(include_mirrors=False)  # type: ignore[attr-defined]
    for name in names:
        database = connections[name]
        tables = database.introspection.django_table_names(only_existing=True, include_views=False)
        with transaction.atomic(using=name), database.cursor() as cursor:
            for table in tables:
                if table not in kept:
                    cursor.execute(f"DELETE FROM {database.ops.quote_name(table)}")


@pytest.fixture(scope="session", autouse=True)
def _transactional_tests_emptied_by_delete() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", _empty_the_tables)
        yield


DATABASE_FIXTURES = ("db", "transactional_db", "django_db_setup")


@pytest.fixture(autouse=True)
def _no_queued_job_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """The queue's tables are not Django's, so no teardown empties them, and a test's rollback does not reach a job
    queued on the queue's own connection: a job a test queued and nothing ran would be run by the next test's
    worker (it was, once: a worker subprocess then logged an outage it had no part in). After each test that uses
    the database, what is still queued is deleted, on a connection of its own, with a warning naming the test."""
    yield
    if not any(name in request.fixturenames for name in DATABASE_FIXTURES):
        return
    import warnings

    import psycopg

    params = connections["default"].get_connection_params()
    try:
        with psycopg.connect(**params, autocommit=True) as link:
            left = link.execute("DELETE FROM procrastinate_jobs WHERE status = 'todo' RETURNING id").fetchall()
    except psycopg.Error:  # a test that took the database away; the next one finds it back
        return
    if left:
        warnings.warn(f"{request.node.nodeid} left {len(left)} queued job(s); deleted", stacklevel=1)


@pytest.fixture(scope="session")
def redis_database() -> Iterator[RedisDatabase]:
    """A database of the machine's Redis for this test process alone (:mod:`tests.redis_kit`), emptied at
    the end; a test that uses it empties it before and after (:meth:`RedisDatabase.empty`)."""
    claimed = claim_database()
    try:
        yield claimed
    finally:
        claimed.release()


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="ada", password="ada-password-1")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bob", password="bob-password-1")


@pytest.fixture
def workspace_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return for_commands(folder.resolve())


@pytest.fixture
def workspace(workspace_dir: Path) -> Workspace:
    return Workspace.objects.create(name="ws", folder=str(workspace_dir), allow_commands=True, open_to_everyone=True)


@pytest.fixture
def endpoint() -> ModelEndpoint:
    return ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")


@pytest.fixture
def chat_session(user: Any, workspace: Workspace, endpoint: ModelEndpoint) -> ChatSession:
    """A session on ``workspace`` with the real tool list, whose endpoint answers nothing."""
    return session_start(
        owner=user,
        workspace=workspace,
        endpoint=endpoint,
        model_name="scripted",
        tools=tool_list(allow_commands=workspace.allow_commands),
    )


@pytest.fixture
def scripted() -> Any:
    from testing.scripted_server import ScriptedServer, Step

    with ScriptedServer(when_empty=Step(fault="http500", text="script exhausted")) as server:
        yield server


@pytest.fixture
def scripted_session(user: Any, workspace: Workspace, scripted: Any) -> ChatSession:
    """A session on ``workspace`` whose endpoint is the scripted server, with the real tool list."""
    from chat.tools import tool_list
    from sessions_app.services.sessions import session_start

    endpoint = ModelEndpoint.objects.create(
        name="scripted", base_url=scripted.base_url, model="scripted", context_window=100_000
    )
    return session_start(
        owner=user,
        workspace=workspace,
        endpoint=endpoint,
        model_name="scripted",
        tools=tool_list(allow_commands=workspace.allow_commands),
    )


@pytest.fixture(autouse=True)
def _requests_checked_against_the_store(settings: Any) -> None:
    """Every request a reply grows step by step must be the one the store gives when read afresh."""
    settings.CACHET_CHECK_REQUESTS = True


@pytest.fixture(autouse=True)
def _no_unexpected_prefix_breaks(request: pytest.FixtureRequest) -> Any:
    """Every request any test makes must share with the one before what its cause allows."""
    from django.db.models.signals import post_save

    from sessions_app.models import BreakCause, ModelRequest

    seen: list[ModelRequest] = []

    def record(sender: Any, instance: ModelRequest, created: bool, **kwargs: Any) -> None:
        if created:
            seen.append(instance)

    post_save.connect(record, sender=ModelRequest, weak=False, dispatch_uid="prefix-check")
    try:
        yield seen
    finally:
        post_save.disconnect(sender=ModelRequest, dispatch_uid="prefix-check")
    if request.node.get_closest_marker("allow_unexpected_break"):
        return
    unexpected = [
        (r.session_id, r.step_number, r.shared_prefix_bytes, r.expected_shared_bytes)
        for r in seen
        if r.break_cause == BreakCause.UNEXPECTED
    ]
    assert unexpected == [], f"requests broke the prefix unexpectedly: {unexpected}"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server with an empty script."""
    with ScriptedServer() as running:
        yield running


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    with ScriptedServer(model="scripted") as server:
        yield server


@pytest.fixture
def live_endpoint(model: ScriptedServer) -> ModelEndpoint:
    return ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")


@pytest.fixture
def notes(workspace_dir: Path) -> Path:
    path = workspace_dir / "notes.md"
    path.write_text("".join(f"line {n}\n" for n in range(1, 31)))
    return path


@pytest.fixture
def live_session(user: Any, workspace: Workspace, live_endpoint: ModelEndpoint, notes: Path) -> ChatSession:
    return session_start(
        owner=user,
        workspace=workspace,
        endpoint=live_endpoint,
        model_name="scripted",
        tools=tool_list(allow_commands=workspace.allow_commands),
    )


def _rg_children() -> dict[int, str]:
    """The ``rg`` processes this process started, by pid, with their state letter (``R``, ``S``, ``Z``…)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
        if name == "rg" and int(parent) == os.getpid():
            found[int(entry.name)] = state
    return found


@pytest.fixture
def rg_children() -> Any:
    """A function listing the ``rg`` processes this test process started (pid → state letter)."""
    return _rg_children


@pytest.fixture(autouse=True)
def _endpoint_listings_forgotten() -> Iterator[None]:
    """Each test asks the model servers afresh: a loopback port may serve another scripted model next time."""
    from chat.agent.endpoints import endpoints_forget

    endpoints_forget()
    yield
    endpoints_forget()
