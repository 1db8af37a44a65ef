"""Request bodies past their limits, under Daphne as ``manage.py serve`` runs it, in a subprocess: a gigabyte POST
is answered 413 after its headers, or as soon as its chunks pass the limit, and the server's memory stays flat; an
import is refused the same way past its own limit and taken under it; logins and forms work as before."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.utils import timezone

from sessions_app.models import ChatSession, ModelEndpoint, Workspace
from sessions_app.selectors.exports import session_export
from sessions_app.services.sessions import session_start
from tests.passwords import give_shipped_password
from tests.serve_kit import Answer, Served, blocks, served, streamed_post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("serve-body-limits")]

MB = 1024 * 1024
GB = 1024 * MB
IMPORT_LIMIT = 8 * MB
FLAT = 50 * MB  # what the server's memory may grow by while it refuses a gigabyte
EARLY = 64 * MB  # what a client may get sent of a refused gigabyte: the socket buffers' worth, not the body
A_FEW_MB = 8 * MB  # what a client may get sent of a refused import or attachment
FLAT_SMALL = 20 * MB  # what the server's memory may grow by while it refuses one
PASSWORD = "ada-password-1"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
MULTIPART = {"Content-Type": "multipart/form-data; boundary=cachet"}


@pytest.fixture(scope="module")
def cachet(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp("serve-body-limits")
    with served(data, CACHET_IMPORT_MAX_BYTES=str(IMPORT_LIMIT)) as running:
        yield running


def refused_gigabyte(cachet: Served, path: str, *, chunked: bool, headers: dict[str, str]) -> Answer:
    """A gigabyte streamed to ``path``, checked to leave the server's memory flat."""
    cachet.reset_peak()
    before = cachet.memory()
    answer = streamed_post(cachet.url, path, blocks(GB), length=None if chunked else GB, headers=headers)
    after = cachet.memory()
    print(
        f"{path} {'chunked' if chunked else 'Content-Length'}: {answer.status} after {answer.sent:,} bytes sent; "
        f"VmRSS {before.rss / MB:.1f} -> {after.rss / MB:.1f} MB, "
        f"VmHWM {before.peak / MB:.1f} -> {after.peak / MB:.1f} MB"
    )
    assert answer.sent < EARLY, "the connection ends once the limit is passed"
    assert after.peak - before.rss < FLAT and after.rss - before.rss < FLAT, cachet.output()[-2000:]
    return answer


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_gigabyte_post_to_login_is_refused_before_it_is_read(cachet: Served, chunked: bool) -> None:
    assert httpx.get(cachet.url + "/login/").status_code == 200
    answer = refused_gigabyte(cachet, "/login/", chunked=chunked, headers=FORM)
    assert answer.status == 413
    assert answer.body == b"Too large: Cachet takes at most 1 MB in one request here.\n"
    assert httpx.get(cachet.url + "/login/").status_code == 200, "and it goes on serving"


def _token(page: str) -> str:
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    return token.group(1)


def _logged_in(cachet: Served, username: str) -> httpx.Client:
    client = httpx.Client(base_url=cachet.url, timeout=60)
    token = _token(client.get("/login/").text)
    response = client.post(
        "/login/", data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/"}
    )
    assert response.status_code == 302 and response.headers["Location"] == "/", response.text
    return client


@pytest.fixture
def session(cachet: Served, django_user_model: Any) -> ChatSession:
    ada = django_user_model.objects.create_superuser(username="ada", password=None)
    give_shipped_password(ada, PASSWORD)  # the served process checks it
    folder = cachet.data / "workspaces" / "team"
    folder.mkdir(parents=True, exist_ok=True)
    workspace = Workspace.objects.create(name="team", folder=str(folder))
    endpoint = ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")
    return session_start(owner=ada, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=[])


def _cookie_header(client: httpx.Client) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{name}={value}" for name, value in client.cookies.items())}


def test_an_import_is_refused_early_past_its_limit_and_taken_under_it(cachet: Served, session: ChatSession) -> None:
    chunks = session_export(owner=session.owner, session_id=session.pk, exported_at=timezone.now())
    assert chunks is not None
    export = "".join(chunks).encode()
    client = _logged_in(cachet, "ada")
    for chunked in (False, True):
        answer = refused_gigabyte(cachet, "/sessions/import", chunked=chunked, headers=MULTIPART)
        assert answer.status == 413
        assert answer.body == b"Log in to attach files or import sessions.\n"
        answer = refused_gigabyte(
            cachet, "/sessions/import", chunked=chunked, headers={**MULTIPART, **_cookie_header(client)}
        )
        assert answer.status == 413
        assert answer.body == b"Too large: an import is at most 8 MB.\n"
    token = _token(client.get("/").text)

    def imported(size: int) -> httpx.Response:
        raw = export + b" " * (size - len(export))  # JSON all the same
        files = {"file": ("export.json", raw, "application/json")}
        return client.post(
            "/sessions/import", data={"workspace": session.workspace.pk, "csrfmiddlewaretoken": token}, files=files
        )

    within_the_request_limit = imported(IMPORT_LIMIT + MB // 2)
    assert within_the_request_limit.status_code == 200
    assert "The file is 8.5 MB; an import is at most 8 MB." in within_the_request_limit.text, "the view's own check"
    taken = imported(2 * MB)  # over the forms' limit: the import's address has its own
    assert taken.status_code == 302, taken.text
    copy = ChatSession.objects.exclude(pk=session.pk).get()
    assert taken.headers["Location"] == f"/sessions/{copy.pk}/"


def test_logins_and_forms_work_as_before(cachet: Served, session: ChatSession) -> None:
    client = _logged_in(cachet, "ada")
    token = _token(client.get("/").text)
    renamed = client.post(f"/sessions/{session.pk}/rename", data={"title": "Kept", "csrfmiddlewaretoken": token})
    assert renamed.status_code == 302
    session.refresh_from_db()
    assert session.title == "Kept"
    themed = client.post("/settings/theme", data={"theme": "dark", "csrfmiddlewaretoken": token})
    assert themed.status_code == 302
    admin = httpx.Client(base_url=cachet.url, timeout=60)
    admin_token = _token(admin.get("/admin/login/").text)
    logged = admin.post(
        "/admin/login/",
        data={"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": admin_token, "next": "/admin/"},
    )
    assert logged.status_code == 302 and logged.headers["Location"] == "/admin/"
    add = "/admin/sessions_app/modelendpoint/add/"
    fields = {
        "name": "second",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "",
        "model": "",
        "context_window": "4096",
    }
    added = admin.post(add, data={**fields, "csrfmiddlewaretoken": _token(admin.get(add).text), "_save": "Save"})
    assert added.status_code == 302, added.text
    assert ModelEndpoint.objects.filter(name="second", context_window=4096).exists()


@pytest.fixture(scope="module")
def as_shipped(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Cachet with the limits it ships with: imports of 64 MB, attachments of 20 MB."""
    with served(tmp_path_factory.mktemp("serve-shipped-limits")) as running:
        yield running


def refused_early(cachet: Served, path: str, size: int, *, chunked: bool) -> Answer:
    """``size`` bytes streamed to ``path`` without a login, checked to be refused after a few MB, memory flat."""
    cachet.reset_peak()
    before = cachet.memory()
    answer = streamed_post(cachet.url, path, blocks(size), length=None if chunked else size, headers=MULTIPART)
    after = cachet.memory()
    print(
        f"{path} {size / MB:.0f} MB {'chunked' if chunked else 'Content-Length'}: {answer.status} after "
        f"{answer.sent / MB:.1f} MB sent; VmRSS {before.rss / MB:.1f} -> {after.rss / MB:.1f} MB, "
        f"VmHWM {before.peak / MB:.1f} -> {after.peak / MB:.1f} MB"
    )
    assert answer.sent < A_FEW_MB, f"{answer.sent / MB:.1f} MB of {size / MB:.0f} MB sent: the body was read"
    assert after.peak - before.rss < FLAT_SMALL and after.rss - before.rss < FLAT_SMALL, cachet.output()[-2000:]
    return answer


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_without_a_login_a_large_import_or_attachment_is_refused_before_it_is_read(
    as_shipped: Served, chunked: bool
) -> None:
    """Import and Attach took 64 MB and 20 MB from anyone, read before the login and CSRF checks: eight anonymous
    60 MB imports at once took a server from 114 to 235 MB."""
    for path, size in (("/sessions/import", 60 * MB), ("/sessions/1/attach", 20 * MB), ("/sessions/new", 20 * MB)):
        answer = refused_early(as_shipped, path, size, chunked=chunked)
        assert (answer.status, answer.body) == (413, b"Log in to attach files or import sessions.\n"), path
    assert httpx.get(as_shipped.url + "/login/").status_code == 200, "and it goes on serving"


def test_a_logged_in_persons_30_mb_import_is_read(as_shipped: Served, django_user_model: Any) -> None:
    ada = django_user_model.objects.create_user(username="ada", password=None)
    give_shipped_password(ada, PASSWORD)
    folder = as_shipped.data / "workspaces" / "team"
    folder.mkdir(parents=True, exist_ok=True)
    workspace = Workspace.objects.create(name="team", folder=str(folder))
    workspace.members.add(ada)
    endpoint = ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")
    session = session_start(owner=ada, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=[])
    chunks = session_export(owner=ada, session_id=session.pk, exported_at=timezone.now())
    assert chunks is not None
    export = "".join(chunks).encode()
    client = _logged_in(as_shipped, "ada")
    token = _token(client.get("/").text)
    raw = export + b" " * (30 * MB - len(export))
    taken = client.post(
        "/sessions/import",
        data={"workspace": workspace.pk, "csrfmiddlewaretoken": token},
        files={"file": ("export.json", raw, "application/json")},
    )
    assert taken.status_code == 302, taken.text
    copy = ChatSession.objects.exclude(pk=session.pk).get()
    assert taken.headers["Location"] == f"/sessions/{copy.pk}/"


def test_daphne_starts_without_its_http2_notice(cachet: Served) -> None:
    output = cachet.output()
    assert "Cachet is serving on " in output and "Listening on TCP address" in output
    assert "HTTP/2" not in output, "Cachet serves HTTP/1.1 (Caddy speaks HTTP/2 in front): nothing to say"
