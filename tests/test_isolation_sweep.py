"""The isolation sweep: every URL pattern the resolver knows and every websocket route, tried by a second
person and by nobody with the first person's real ids, with ids out of range or malformed, and by the first
person once removed from the session's workspace.

The routes are read from ``get_resolver().url_patterns`` (recursively) and ``chat.routing``, so a view
added later is swept without touching this file; a URL argument the sweep cannot fill fails it by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern
from django.utils.regex_helper import normalize

from cachet.asgi import application
from chat.agent.loop import ReplyLoop
from chat.web.routing import websocket_urlpatterns
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, Result, Turn, Upload, Workspace
from sessions_app.services.sessions import session_rename
from sessions_app.services.tokens import api_token_create
from sessions_app.services.uploads import upload_record
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run
from tests.worker_kit import forget_jobs

SECRETS = ("ada-secret-title-5b1e", "ada-secret-words-9c2d", "ada-secret-file-3f7a", "ada-secret-reply-7d04")
BAD_IDS = ("0", "-1", "99999999999999999999", "abc")
MISSING_ID = "2147480000"  # well formed, in range, nobody's
PUBLIC_VIEWS = {"login", "logout", "favicon"}  # what a person reaches before logging in
SIGN_IN_VIEWS = {"oidc_login", "oidc_callback"}  # the provider's way in: a 404 while OIDC is off, as in the tests
TOKEN_VIEWS = {"metrics"}  # a scraper's, with a token of its own: off (404) or refused (401) to everybody else
# a stopped link (the one swept) shows nobody anything, its owner neither, and copies nothing
LINK_VIEWS = {"shared", "shared_turns", "shared_copy"}
POSTED = {"title": "bob-was-here", "text": "bob-was-here", "mode": "full", "workspace": "1", "endpoint": "1"}


@dataclass(frozen=True)
class Route:
    """One URL pattern: its path with ``{name}`` holes, the names, and the view's name (or route)."""

    template: str
    kwargs: tuple[str, ...]
    name: str
    namespace: str

    @property
    def admin(self) -> bool:
        return self.namespace == "admin"

    def path(self, values: dict[str, str]) -> str:
        return "/" + self.template.format(**values)


def _template(pattern: RoutePattern | RegexPattern | Any) -> tuple[str, tuple[str, ...]]:
    if isinstance(pattern, RoutePattern):
        route = str(pattern)
        names = tuple(re.findall(r"<(?:\w+:)?(\w+)>", route))
        return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route), names
    if isinstance(pattern, RegexPattern):
        text, params = normalize(pattern.regex.pattern)[0]
        return re.sub(r"%\((\w+)\)s", r"{\1}", text), tuple(params)
    raise AssertionError(f"the sweep does not know the pattern type {type(pattern).__name__}")


def walk(patterns: list[Any], prefix: str = "", kwargs: tuple[str, ...] = (), namespace: str = "") -> Iterator[Route]:
    """Every leaf pattern below ``patterns``, with the prefixes and arguments of the includes above it."""
    for entry in patterns:
        template, names = _template(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from walk(entry.url_patterns, prefix + template, kwargs + names, entry.namespace or namespace)
        elif isinstance(entry, URLPattern):
            name = f"{namespace}:{entry.name}" if namespace and entry.name else entry.name or prefix + template
            yield Route(prefix + template, kwargs + names, name, namespace)


URL_ROUTES = list(walk(get_resolver().url_patterns))
API_ROUTES = [route for route in URL_ROUTES if route.template.startswith("api/")]  # a token's, not a cookie's
APP_ROUTES = [route for route in URL_ROUTES if not route.admin and route not in API_ROUTES]
ADMIN_ROUTES = [route for route in URL_ROUTES if route.admin]
WS_ROUTES = list(walk(websocket_urlpatterns))


@dataclass(frozen=True)
class Owned:
    session: ChatSession
    turn: Turn
    result: Result
    request: ModelRequest
    upload: Upload


# Each URL argument the app's views take, filled from the first person's real objects.
APP_KWARGS: dict[str, Callable[[Owned], object]] = {
    "session_id": lambda owned: owned.session.pk,
    "number": lambda owned: owned.result.number,  # a result's number within its session
    "turn_id": lambda owned: owned.turn.pk,
    "result_id": lambda owned: owned.result.pk,
    "request_id": lambda owned: owned.request.pk,
    "upload_id": lambda owned: owned.upload.pk,  # a file attached, waiting for the next message
    "token": lambda owned: _stopped_share(owned),  # a link the owner stopped: it shows nobody anything
    "token_id": lambda owned: api_token_create(owner=owned.session.owner, name="swept", access="write").token.pk,
    "rid": lambda owned: f"{owned.result.number:04x}",  # a result's id as the model saw it, without its #
    "rest": lambda owned: f"v1/sessions/{owned.session.pk}/nothing-here",  # any other path under /api/
}


def _stopped_share(owned: Owned) -> str:
    from django.utils import timezone

    from sessions_app.models import SessionShare

    share, _ = SessionShare.objects.get_or_create(session=owned.session, token=f"stopped-{owned.session.pk}")
    SessionShare.objects.filter(pk=share.pk).update(revoked_at=timezone.now())
    return share.token


# The admin's arguments: staff only, so any value that resolves to the pattern will do.
ADMIN_KWARGS: dict[str, Callable[[Owned], object]] = {
    "object_id": lambda owned: owned.session.pk,
    "id": lambda owned: owned.session.owner_id,  # the user whose password the admin sets
    "app_label": lambda owned: "sessions_app",
    "content_type_id": lambda owned: ContentType.objects.get_for_model(ChatSession).pk,
    "url": lambda owned: "nothing-here/",
}


def values_for(route: Route, owned: Owned) -> dict[str, str]:
    known = ADMIN_KWARGS if route.admin else APP_KWARGS
    unknown = [name for name in route.kwargs if name not in known]
    if unknown:
        pytest.fail(
            f"the isolation sweep does not know the URL argument {unknown[0]!r} of {route.name} "
            f"(/{route.template}); add it to {'ADMIN_KWARGS' if route.admin else 'APP_KWARGS'} in {__file__}"
        )
    return {name: str(known[name](owned)) for name in route.kwargs}


@pytest.fixture
def owned(scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path) -> Owned:
    """The first person's session with a turn, a stored result and a model request, all carrying secrets."""
    (workspace_dir / "notes.md").write_text(f"{SECRETS[2]}\n")
    scripted.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text=SECRETS[3]))
    run(ReplyLoop(scripted_session).send(SECRETS[1]))
    session = session_rename(session=scripted_session, title=SECRETS[0])
    (workspace_dir / "attached.txt").write_text("attached\n")
    upload = upload_record(session=session, path="attached.txt", size=9, sha256=sha256(b"attached\n").hexdigest())
    return Owned(
        session=session,
        turn=Turn.objects.get(session=session),
        result=Result.objects.get(session=session),
        request=ModelRequest.objects.filter(session=session).first() or pytest.fail("no model request stored"),
        upload=upload,
    )


def _intact(owned: Owned) -> None:
    session = ChatSession.objects.get(pk=owned.session.pk)
    assert session.title == SECRETS[0] and session.mode == owned.session.mode
    assert Turn.objects.filter(session=session).count() == 1 and Result.objects.filter(session=session).count() == 1
    assert Upload.objects.filter(pk=owned.upload.pk, turn__isnull=True).exists(), "the attachment still waits"


def _leaks(body: bytes) -> list[str]:
    text = body.decode(errors="replace")
    return [secret for secret in SECRETS if secret in text]


def _send(client: Client, method: str, path: str) -> Any:
    return client.get(path) if method == "GET" else client.post(path, POSTED)


def _bob(other_user: Any) -> Client:
    client = Client()
    client.force_login(other_user)
    return client


def test_the_sweep_finds_every_route() -> None:
    names = {route.name for route in URL_ROUTES}
    assert {"home", "session", "session_rename", "session_delete", "session_chart", "result"} <= names
    assert {"login", "logout", "password_change", "admin:index", "admin:sessions_app_chatsession_change"} <= names
    assert "ws/sessions/{session_id}/" in [route.template for route in WS_ROUTES]


def test_a_second_person_gets_404_for_every_id_of_the_first(owned: Owned, other_user: Any) -> None:
    failures: list[str] = []
    swept = 0
    bob = _bob(other_user)
    for route in APP_ROUTES:
        if not route.kwargs:
            continue
        path = route.path(values_for(route, owned))
        missing = route.path(dict.fromkeys(route.kwargs, MISSING_ID))
        for method in ("GET", "POST"):
            bob.force_login(other_user)
            response = _send(bob, method, path)
            swept += 1
            if _leaks(response.content):
                failures.append(f"{method} {path}: shows {_leaks(response.content)}")
            if response.status_code == 404:
                continue
            baseline = _send(bob, method, missing)
            same = (baseline.status_code, baseline.content) == (response.status_code, response.content)
            if response.status_code == 405 and same:
                continue  # the view never takes this method: the same answer as for an id nobody has
            failures.append(f"{method} {path}: {response.status_code}, not 404")
    assert failures == []
    assert swept >= 10  # five routes with ids today, each GET and POST
    _intact(owned)


def test_pages_without_ids_show_a_second_person_nothing_of_the_first(owned: Owned, other_user: Any) -> None:
    failures: list[str] = []
    bob = _bob(other_user)
    for route in APP_ROUTES:
        if route.kwargs:
            continue
        for method in ("GET", "POST"):
            bob.force_login(other_user)
            response = _send(bob, method, route.path({}))
            if response.status_code >= 500 or _leaks(response.content):
                failures.append(f"{method} /{route.template}: {response.status_code} {_leaks(response.content)}")
    assert failures == []
    _intact(owned)


def test_nobody_logged_in_is_sent_to_the_login_page(owned: Owned) -> None:
    failures: list[str] = []
    for route in APP_ROUTES:
        path = route.path(values_for(route, owned))
        for method in ("GET", "POST"):
            response = _send(Client(), method, path)
            location = response.headers.get("Location", "")
            if _leaks(response.content):
                failures.append(f"{method} {path}: shows {_leaks(response.content)}")
            elif route.name in PUBLIC_VIEWS:
                if response.status_code not in (200, 301, 302, 405):
                    failures.append(f"{method} {path}: {response.status_code}")
            elif route.name in SIGN_IN_VIEWS:
                if response.status_code not in (404, 405):
                    failures.append(f"{method} {path}: {response.status_code}")
            elif route.name in TOKEN_VIEWS:
                if response.status_code not in (401, 404, 405):
                    failures.append(f"{method} {path}: {response.status_code}, not refused")
            elif not (
                response.status_code == 302
                and (location.startswith("/login/?next=") or (route.name == "home" and location == "/login/"))
            ):  # the root's login lands on a message box, not back on the list
                failures.append(f"{method} {path}: {response.status_code} {location}, not a redirect to log in")
    assert failures == []
    _intact(owned)


def test_the_admin_is_staff_only(owned: Owned, other_user: Any) -> None:
    failures: list[str] = []
    swept = 0
    for route in ADMIN_ROUTES:
        path = route.path(values_for(route, owned))
        for identity in ("bob", "nobody"):
            for method in ("GET", "POST"):
                client = _bob(other_user) if identity == "bob" else Client()
                response = _send(client, method, path)
                swept += 1
                location = response.headers.get("Location", "")
                if _leaks(response.content):
                    failures.append(f"{identity} {method} {path}: shows {_leaks(response.content)}")
                elif route.name == "admin:login" and response.status_code == 200:
                    continue
                elif route.name == "admin:logout" and (response.status_code, location) == (302, "/admin/"):
                    continue  # Django sends a non-staff logout to the admin's index, which sends to the login
                elif not (response.status_code == 302 and location.startswith("/admin/login/")):
                    failures.append(f"{identity} {method} {path}: {response.status_code} {location}")
    assert failures == []
    assert swept >= 4 * 60
    _intact(owned)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_ids_out_of_range_or_malformed_are_404_never_500(owned: Owned, user: Any, other_user: Any, bad: str) -> None:
    failures: list[str] = []
    for route in APP_ROUTES:
        if not route.kwargs:
            continue
        real = values_for(route, owned)
        for name in route.kwargs:
            path = route.path({**real, name: bad})
            missing = route.path({**real, name: MISSING_ID})
            for person in (user, other_user):
                client = Client()
                client.force_login(person)
                for method in ("GET", "POST"):
                    response = _send(client, method, path)
                    if response.status_code == 404:
                        continue
                    baseline = _send(client, method, missing)
                    if response.status_code == 405 and baseline.status_code == 405:
                        continue  # the view never takes this method, whatever the id
                    failures.append(f"{person.username} {method} {path}: {response.status_code}")
    assert failures == []
    _intact(owned)


# Websockets: through the whole ASGI stack, as the browser connects.


def _cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _socket(path: str, cookie: str | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def _closed_without_a_word(communicator: WebsocketCommunicator) -> str | None:
    """``None`` when the handshake was refused, or accepted and closed with 4404 before any message."""
    ok, _ = await communicator.connect(timeout=10)
    if not ok:
        return None
    output = await communicator.receive_output(timeout=10)
    if output != {"type": "websocket.close", "code": 4404}:
        return f"received {output!r}"
    return None if await communicator.receive_nothing(timeout=0.5) else "received more after closing"


WS_CASES = [
    pytest.param(route, identity, id=f"{route.template}-{identity}")
    for route in WS_ROUTES
    for identity in ("bob", "nobody")
]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("route", "identity"), WS_CASES)
async def test_a_second_person_cannot_open_the_first_persons_socket(
    owned: Owned, other_user: Any, route: Route, identity: str
) -> None:
    values = await database_sync_to_async(values_for)(route, owned)
    cookie = await database_sync_to_async(_cookie)(other_user) if identity == "bob" else None
    communicator = _socket(route.path(values), cookie)
    try:
        assert await _closed_without_a_word(communicator) is None
    finally:
        await communicator.disconnect()


WS_BAD_CASES = [
    pytest.param(route, bad, id=f"{route.template}-{bad}") for route in WS_ROUTES if route.kwargs for bad in BAD_IDS
]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("route", "bad"), WS_BAD_CASES)
async def test_a_socket_with_an_id_out_of_range_or_malformed_closes_cleanly(
    owned: Owned, user: Any, route: Route, bad: str
) -> None:
    values = await database_sync_to_async(values_for)(route, owned)
    cookie = await database_sync_to_async(_cookie)(user)
    for name in route.kwargs:
        communicator = _socket(route.path({**values, name: bad}), cookie)
        try:
            assert await _closed_without_a_word(communicator) is None
        finally:
            await communicator.disconnect()


# Removal: the first person, removed from the session's workspace, still reads their own session (and may rename
# or delete it, as it is theirs), but through no page and no message of its socket can they start a session on
# the workspace, add to the session, take anything back, change its mode or model, or touch the workspace.

REMOVED = "You are no longer a member of the workspace “ws”: this session is read-only."
LAST_ROUTES = ("session_delete",)  # deleting one's own session stays possible: swept last


def _folder(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _stored(owned: Owned) -> tuple[int, int, int, int]:
    return (
        ChatSession.objects.filter(workspace_id=owned.session.workspace_id).count(),
        Turn.objects.filter(session=owned.session).count(),
        Result.objects.filter(session=owned.session).count(),
        ModelRequest.objects.filter(session=owned.session).count(),
    )


def _sweep_removed(client: Client, user: Any, routes: list[Route], owned: Owned, posted: dict[str, str]) -> list[str]:
    """Every method of ``routes`` as the removed first person: never a 5xx, the own pages load, the page is
    read-only."""
    failures: list[str] = []
    for route in routes:
        path = route.path(values_for(route, owned))
        for method in ("GET", "POST"):
            client.force_login(user)
            response = client.get(path) if method == "GET" else client.post(path, posted)
            if response.status_code >= 500:
                failures.append(f"{method} {path}: {response.status_code}")
            loads = response.status_code in (200, 405)  # 405: a view that takes POST only
            if method == "GET" and route.kwargs and not loads and route.name not in LINK_VIEWS:
                failures.append(f"GET {path}: {response.status_code}, not 200: the person's own pages load")
            if route.name == "session" and method == "GET":
                page = response.content.decode()
                if REMOVED not in page or 'id="composer"' in page or 'id="controls"' in page:
                    failures.append(f"GET {path}: not read-only")
    return failures


def test_a_removed_member_reads_their_session_through_every_url_and_changes_nothing(
    owned: Owned, user: Any, other_user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    Workspace.objects.filter(pk=owned.session.workspace_id).update(open_to_everyone=False)
    owned.session.workspace.members.add(other_user)  # staff give the workspace a member: ada is not one
    files, stored, asked = _folder(workspace_dir), _stored(owned), len(scripted.requests)
    posted = {**POSTED, "workspace": str(owned.session.workspace_id), "endpoint": str(owned.session.endpoint_id)}
    ada = Client()
    routes = [route for route in APP_ROUTES if route.name not in PUBLIC_VIEWS | TOKEN_VIEWS | SIGN_IN_VIEWS]
    assert _sweep_removed(ada, user, [r for r in routes if r.name not in LAST_ROUTES], owned, posted) == []
    assert _folder(workspace_dir) == files, "nothing in the workspace changed"
    assert len(scripted.requests) == asked, "nothing was asked of the model"
    assert _stored(owned) == stored, "no session started on the workspace, no turn, result or request"
    assert _sweep_removed(ada, user, [r for r in routes if r.name in LAST_ROUTES], owned, posted) == []
    assert ChatSession.objects.get(pk=owned.session.pk).deleted_at is not None, "one's own session can still be deleted"
    assert _folder(workspace_dir) == files


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_removed_member_is_refused_every_socket_action_but_stop_and_reading(
    owned: Owned, user: Any, other_user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    import json

    def remove() -> tuple[dict[str, bytes], tuple[int, int, int, int]]:
        Workspace.objects.filter(pk=owned.session.workspace_id).update(open_to_everyone=False)
        owned.session.workspace.members.add(other_user)
        return _folder(workspace_dir), _stored(owned)

    files, stored = await database_sync_to_async(remove)()
    asked = len(scripted.requests)
    cookie = await database_sync_to_async(_cookie)(user)
    communicator = _socket(f"/ws/sessions/{owned.session.pk}/", cookie)
    acting = [
        {"type": "send", "text": "still here?"},
        {"type": "edit", "turn": 1, "text": "changed"},
        {"type": "regenerate"},
        {"type": "undo", "restore": "1"},
        {"type": "rewind", "turn": 1, "restore": "1"},
        {"type": "flip", "turn": 1},
        {"type": "compact"},
        {"type": "mode", "mode": "full"},
        {"type": "model", "endpoint": str(owned.session.endpoint_id), "model": "other"},
    ]
    try:
        ok, _ = await communicator.connect(timeout=10)
        assert ok
        await communicator.send_json_to({"type": "hello", "rev": 0, "first": 0, "bar": 0})
        caught = await communicator.receive_from(timeout=10)
        assert SECRETS[1] in caught, "the person's own turns come"
        while not await communicator.receive_nothing(timeout=0.3):
            await communicator.receive_from(timeout=5)
        for message in acting:
            await communicator.send_json_to(message)
            answer = json.loads(await communicator.receive_from(timeout=10))
            notices = [op["html"] for op in answer.get("ops", []) if op.get("id") == "notice"]
            assert notices and REMOVED in notices[0], message
            assert await communicator.receive_nothing(timeout=0.3), f"{message}: nothing else happens"
        await communicator.send_json_to({"type": "stop"})
        assert await communicator.receive_nothing(timeout=0.3), "stop is taken, with nothing to stop"
    finally:
        await communicator.disconnect()
    assert await database_sync_to_async(_folder)(workspace_dir) == files
    assert await database_sync_to_async(_stored)(owned) == stored
    assert len(scripted.requests) == asked
    session = await database_sync_to_async(ChatSession.objects.get)(pk=owned.session.pk)
    assert (session.mode, session.model_name) == (owned.session.mode, owned.session.model_name)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_endpoint_not_granted_is_offered_nowhere_and_every_request_to_it_is_refused_until_granted_again(
    owned: Owned, user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    """Its grant taken back (the endpoint closed to everyone, the person in none of its groups): no page offers it,
    New chat naming it starts nothing, the model menu cannot move to it, and every socket action that would ask it
    is refused with nothing asked; granted again to a group of theirs, the session goes on."""
    import json

    from django.contrib.auth.models import Group

    endpoint_id = owned.session.endpoint_id

    def close() -> tuple[dict[str, bytes], tuple[int, int, int, int]]:
        ModelEndpoint.objects.filter(pk=endpoint_id).update(open_to_everyone=False)
        ModelEndpoint.objects.get(pk=endpoint_id).groups.add(Group.objects.create(name="granted"))
        return _folder(workspace_dir), _stored(owned)

    def pages() -> list[str]:
        ada = Client()
        ada.force_login(user)
        offered = [
            path
            for path in ("/sessions/new", f"/sessions/{owned.session.pk}/models")
            if f'value="{endpoint_id}:' in ada.get(path).content.decode()
        ]
        started = {**POSTED, "workspace": str(owned.session.workspace_id), "endpoint": f"{endpoint_id}:scripted"}
        if ada.post("/sessions/new", started).status_code != 200:
            offered.append("POST /sessions/new")
        return offered

    files, stored = await database_sync_to_async(close)()
    asked = len(scripted.requests)
    assert await database_sync_to_async(pages)() == [], "offered nowhere, and New chat naming it is refused"
    cookie = await database_sync_to_async(_cookie)(user)
    communicator = _socket(f"/ws/sessions/{owned.session.pk}/", cookie)
    asking = [
        {"type": "send", "text": "still here?"},
        {"type": "edit", "turn": 1, "text": "changed"},
        {"type": "regenerate"},
        {"type": "compact"},
        {"type": "model", "endpoint": f"{endpoint_id}:scripted", "model": "other"},
    ]
    try:
        ok, _ = await communicator.connect(timeout=10)
        assert ok
        await communicator.send_json_to({"type": "hello", "rev": 0, "first": 0, "bar": 0})
        while not await communicator.receive_nothing(timeout=0.3):
            await communicator.receive_from(timeout=5)
        for message in asking:
            await communicator.send_json_to(message)
            answer = json.loads(await communicator.receive_from(timeout=10))
            notices = [op["html"] for op in answer.get("ops", []) if op.get("id") == "notice"]
            refused = ("You may no longer use the model endpoint", f"There is no model endpoint {endpoint_id}.")
            assert notices and any(text in notices[0] for text in refused), message
            assert await communicator.receive_nothing(timeout=0.3), f"{message}: nothing else happens"
    finally:
        await communicator.disconnect()
    assert await database_sync_to_async(_folder)(workspace_dir) == files
    assert await database_sync_to_async(_stored)(owned) == stored
    assert len(scripted.requests) == asked, "nothing was asked of the model"

    await database_sync_to_async(lambda: user.groups.add(Group.objects.get(name="granted")))()
    try:
        assert len(await database_sync_to_async(pages)()) == 3, "granted again: offered, and New chat starts on it"
    finally:  # the queue's rows outlive a test (its tables are not Django's to empty): no later worker runs this one
        await database_sync_to_async(forget_jobs)()


# The API: the same promises for a token as for a cookie. A second person's token finds none of the first person's
# ids; no token (a cookie neither) reaches anything; a bad id is a 404; a removed member reads through the API and
# changes nothing of the session or the workspace.

API_PUBLIC = {"api-v1:openapi-json", "api_index", "api-v1:api-root"}  # the schema, and where it is
API_METHODS = ("GET", "POST", "PATCH", "DELETE")
API_BODY = {"title": "bob-was-here", "text": "bob-was-here", "turn": 1, "restore": True, "archived": True}
STREAMS = {"api-v1:session_events"}  # the owner's answer is a stream that lasts while they listen


def _api(client: Client, method: str, path: str, secret: str | None) -> Any:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    call = getattr(client, method.lower())
    return call(path, API_BODY, content_type="application/json", headers=headers)


def test_the_sweep_finds_the_api() -> None:
    names = {route.name for route in API_ROUTES}
    assert {"api-v1:sessions_list", "api-v1:message_send", "api-v1:result_read", "api-v1:session_events"} <= names
    assert len(API_ROUTES) >= 18


def test_a_second_persons_token_gets_404_for_every_id_of_the_first(owned: Owned, other_user: Any) -> None:
    bobs = api_token_create(owner=other_user, name="bob", access="write").secret
    failures: list[str] = []
    swept = 0
    for route in API_ROUTES:
        if not route.kwargs:
            continue
        path = route.path(values_for(route, owned))
        missing = route.path(dict.fromkeys(route.kwargs, MISSING_ID))
        for method in API_METHODS:
            response = _api(Client(), method, path, bobs)
            swept += 1
            if _leaks(response.content):
                failures.append(f"{method} {path}: shows {_leaks(response.content)}")
            if response.status_code == 404:
                continue
            baseline = _api(Client(), method, missing, bobs)
            if response.status_code == 405 and baseline.status_code == 405:
                continue
            failures.append(f"{method} {path}: {response.status_code}, not 404")
    assert failures == []
    assert swept >= 4 * 14
    listed = _api(Client(), "GET", "/api/v1/sessions", bobs).json()
    assert listed == {"count": 0, "items": []}
    _intact(owned)


def test_no_token_reaches_nothing_of_the_api_a_logged_in_cookie_neither(owned: Owned, user: Any) -> None:
    failures: list[str] = []
    with_cookie = Client()
    with_cookie.force_login(user)
    for route in API_ROUTES:
        path = route.path(values_for(route, owned))
        for client in (Client(), with_cookie):
            for method in API_METHODS:
                response = _api(client, method, path, None)
                if _leaks(response.content):
                    failures.append(f"{method} {path}: shows {_leaks(response.content)}")
                elif route.name in API_PUBLIC or route.name == "api/{rest}":
                    if response.status_code not in (200, 404, 405):
                        failures.append(f"{method} {path}: {response.status_code}")
                elif response.status_code not in (401, 405):
                    failures.append(f"{method} {path}: {response.status_code}, not 401")
    assert failures == []
    _intact(owned)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_api_ids_out_of_range_or_malformed_are_404_never_500(owned: Owned, user: Any, bad: str) -> None:
    secret = api_token_create(owner=user, name="own", access="write").secret
    failures: list[str] = []
    for route in API_ROUTES:
        real = values_for(route, owned)
        for name in route.kwargs:
            path = route.path({**real, name: bad})
            for method in API_METHODS:
                response = _api(Client(), method, path, secret)
                if response.status_code in (404, 405):
                    continue
                failures.append(f"{method} {path}: {response.status_code}")
    assert failures == []
    _intact(owned)


def test_a_removed_member_reads_through_the_api_and_changes_nothing(
    owned: Owned, user: Any, other_user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    Workspace.objects.filter(pk=owned.session.workspace_id).update(open_to_everyone=False)
    owned.session.workspace.members.add(other_user)
    files, stored, asked = _folder(workspace_dir), _stored(owned), len(scripted.requests)
    secret = api_token_create(owner=user, name="own", access="write").secret
    failures: list[str] = []
    session = f"/api/v1/sessions/{owned.session.pk}"
    for route in API_ROUTES:
        if route.name in STREAMS or not route.kwargs or route.name == "api/{rest}":
            continue
        response = _api(Client(), "GET", route.path(values_for(route, owned)), secret)
        if response.status_code not in (200, 405):
            failures.append(f"GET /{route.template}: {response.status_code}, not 200: their own session reads")
    read = _api(Client(), "GET", session, secret).json()
    assert read["read_only"] == REMOVED
    for action in ("messages", "regenerate", "undo", "rewind"):
        response = _api(Client(), "POST", f"{session}/{action}", secret)
        if response.status_code != 403 or response.json()["detail"] != REMOVED:
            failures.append(f"POST {action}: {response.status_code} {response.content[:200]!r}")
    body = {"text": "a new one", "workspace": owned.session.workspace_id, "endpoint": owned.session.endpoint_id}
    started = Client().post(
        "/api/v1/sessions", body, content_type="application/json", headers={"Authorization": f"Bearer {secret}"}
    )
    if started.status_code != 404:
        failures.append(f"POST /api/v1/sessions on the workspace: {started.status_code}")
    assert _api(Client(), "POST", f"{session}/stop", secret).status_code == 200, "stop is taken, with nothing to stop"
    assert failures == []
    assert _folder(workspace_dir) == files
    assert _stored(owned) == stored
    assert len(scripted.requests) == asked
