"""The pages: login, the session list, a new session, the chat page, a stored result and the chart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from procrastinate.contrib.django.models import ProcrastinateJob

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.locks import reply_lock
from sessions_app.services.sessions import session_start
from sessions_app.services.setup import endpoint_window_record
from sessions_app.services.turns import turn_start
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


@pytest.fixture
def bob(other_user: Any) -> Client:
    client = Client()
    client.force_login(other_user)
    return client


def chatted(session: ChatSession, model: ScriptedServer) -> ChatSession:
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(text="The notes have **30** lines. <script>alert(1)</script>"),
    )
    run(ReplyLoop(session).send("How long are the notes?"))
    return session


def test_the_root_leads_to_the_login_page_when_logged_out(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/login/"  # no next: the login lands on a message box
    assert client.get("/login/").status_code == 200


@pytest.mark.parametrize(
    "path",
    ["/sessions/new", "/sessions/1/", "/sessions/1/chart", "/sessions/1/results/1/", "/sessions/1/turns/1/source"],
)
def test_every_page_needs_a_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_login_and_logout(client: Client, user: Any) -> None:
    response = client.post("/login/", {"username": "ada", "password": "ada-password-1"})
    assert response.status_code == 302 and response["Location"] == "/sessions/new"
    deep = client.post("/login/?next=/sessions/1/", {"username": "ada", "password": "ada-password-1"})
    assert deep["Location"] == "/sessions/1/", "a deep link comes back to itself"
    assert client.get("/").status_code == 200
    client.post("/logout/")
    assert client.get("/").status_code == 302


def test_the_session_list_shows_only_ones_own_sessions_newest_first(
    ada: Client, user: Any, other_user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    older = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[])
    newer = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[])
    session_start(owner=other_user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[], title="Bob's")
    turn_start(session=older, words="What is in  the\nworkspace?", today="2026-11-29", instructions=None)
    older.refresh_from_db()
    html = ada.get("/").content.decode()
    assert "Bob&#x27;s" not in html and "Bob's" not in html
    assert html.index(f'id="session-{older.pk}"') < html.index(f'id="session-{newer.pk}"')
    assert "What is in the workspace?" in html
    assert "New session" in html
    assert "Delete “New session”? It leaves your lists, searches and links; staff can still see it in the admin." in (
        html
    ), "the name the list shows, and what Delete does (the session is kept)"
    assert f"Session {newer.pk}" not in html
    assert "0 minutes ago" not in html and re.search(r">(now|a second ago|\d+ seconds ago)</time>", html), "just used"


def test_new_session_offers_the_users_workspaces_and_starts_with_the_tools(
    ada: Client, user: Any, other_user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    private = Workspace.objects.create(name="bobs", folder="/tmp")
    private.members.add(other_user)
    html = ada.get("/sessions/new").content.decode()
    assert ">ws<" in html and ">bobs<" not in html
    response = ada.post(
        "/sessions/new",
        {"text": "Hello", "workspace": workspace.pk, "endpoint": endpoint.pk, "model": "", "mode": "plan"},
    )
    session = ChatSession.objects.get(owner=user)
    assert response["Location"] == f"/sessions/{session.pk}/"
    assert session.model_name == "scripted" and session.mode == "plan"
    tools = session.generations.get().tools_json
    assert '"name":"read"' in tools and '"name":"run"' in tools  # the fixture's workspace allows commands
    refused = ada.post(
        "/sessions/new", {"text": "Hello", "workspace": private.pk, "endpoint": endpoint.pk, "mode": "edit"}
    )
    assert refused.status_code == 200 and ChatSession.objects.count() == 1


def test_new_session_starts_in_ones_own_workspace_then_as_the_last_session_was(
    ada: Client,
    bob: Client,
    user: Any,
    other_user: Any,
    workspace: Workspace,
    endpoint: ModelEndpoint,
    tmp_path: Path,
    settings: Any,
) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
    html = ada.get("/sessions/new").content.decode()
    own = Workspace.objects.get(owner=user)
    assert f'<option value="{own.pk}" selected>ada&#x27;s files</option>' in html, "made and chosen on first use"
    assert f'<option value="{workspace.pk}">ws</option>' in html, "shared ones stay on offer"
    assert "ada&#x27;s files" not in bob.get("/sessions/new").content.decode(), "nobody else's"
    ada.post(
        "/sessions/new",
        {"text": "Hello", "workspace": workspace.pk, "endpoint": f"{endpoint.pk}:other-model", "mode": "plan"},
    )
    again = ada.get("/sessions/new").content.decode()
    assert f'<option value="{workspace.pk}" selected>ws</option>' in again
    assert '<option value="plan" selected>' in again
    assert any(
        value == f"{endpoint.pk}:other-model" and selected
        for options in options_of(again, "endpoint").values()
        for value, _, selected in options
    ), "the last session's model"


def test_new_chat_does_not_start_from_a_model_gone_from_its_server_or_a_folder_named_from_a_shell(
    ada: Client, user: Any, workspace: Workspace, tmp_path: Path
) -> None:
    """New chat preselected the last session's model though its server no longer listed it, and the workspace of a
    folder ``ask --workspace`` had named, as the browser's default."""
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as server:
        default = ModelEndpoint.objects.create(name="default", base_url=server.base_url)
        shell = Workspace.objects.create(name="repo", folder=str(tmp_path / "repo"), from_shell=True)
        shell.members.add(user)
        session_start(owner=user, workspace=shell, endpoint=default, model_name="gone-model", tools=[])
        html = ada.get("/sessions/new").content.decode()
        chosen = [value for options in options_of(html, "endpoint").values() for value, _, on in options if on]
        assert chosen == [f"{default.pk}:alpha"], "the default endpoint's model, not one its server no longer lists"
        assert f'<option value="{shell.pk}" selected>' not in html and f'<option value="{shell.pk}">' in html
        session_start(owner=user, workspace=workspace, endpoint=default, model_name="beta", tools=[])
        html = ada.get("/sessions/new").content.decode()
        chosen = [value for options in options_of(html, "endpoint").values() for value, _, on in options if on]
        assert chosen == [f"{default.pk}:beta"] and f'<option value="{workspace.pk}" selected>' in html


def test_new_session_asks_the_server_for_a_model_when_the_endpoint_names_none(
    ada: Client, user: Any, workspace: Workspace, model: ScriptedServer
) -> None:
    listed = ModelEndpoint.objects.create(name="listed", base_url=model.base_url, model="")
    ada.post("/sessions/new", {"text": "Hello", "workspace": workspace.pk, "endpoint": listed.pk, "mode": "edit"})
    assert ChatSession.objects.get(owner=user).model_name == "scripted"
    gone = ModelEndpoint.objects.create(name="gone", base_url="http://127.0.0.1:9/v1", model="")
    ada.post("/sessions/new", {"text": "Hello", "workspace": workspace.pk, "endpoint": gone.pk, "mode": "edit"})
    assert ChatSession.objects.filter(owner=user, endpoint=gone).get().model_name == "default"


def options_of(html: str, select: str) -> dict[str, list[tuple[str, str, bool]]]:
    """The options of the select named ``select``, by the label of their group: (value, text, selected)."""
    body = html[html.index(f'<select name="{select}"') :]
    body = body[: body.index("</select>")]
    groups: dict[str, list[tuple[str, str, bool]]] = {}
    for label, inner in re.findall(r'<optgroup label="([^"]*)">(.*?)</optgroup>', body, re.S):
        groups[label] = [
            (value, text, bool(selected))
            for value, selected, text in re.findall(r'<option value="([^"]*)"( selected)?>([^<]*)</option>', inner)
        ]
    return groups


def test_new_session_offers_the_models_each_endpoint_lists_with_the_default_chosen(
    ada: Client, user: Any, workspace: Workspace
) -> None:
    dead = ModelEndpoint.objects.create(name="gone", base_url="http://127.0.0.1:9/v1")
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as one, ScriptedServer(model="gamma") as two:
        second = ModelEndpoint.objects.create(name="a-second", base_url=two.base_url, model="gamma")
        default = ModelEndpoint.objects.create(name="default", base_url=one.base_url)
        html = ada.get("/sessions/new").content.decode()
        assert options_of(html, "endpoint") == {
            f"default · {one.base_url}": [
                (f"{default.pk}:alpha", "alpha", True),
                (f"{default.pk}:beta", "beta", False),
            ],
            f"a-second · {two.base_url}": [(f"{second.pk}:gamma", "gamma", False)],
            "gone · http://127.0.0.1:9/v1 · does not answer": [(f"{dead.pk}:", "the model typed below", False)],
        }
        assert next(iter(options_of(html, "endpoint"))).startswith("default"), "the default endpoint comes first"
        assert "gone (http://127.0.0.1:9/v1) does not answer: connection refused." in html
        assert '<input type="text" name="model"' in html, "a model can still be typed"
        chosen = ada.post(
            "/sessions/new",
            {"text": "Hello", "workspace": workspace.pk, "endpoint": f"{default.pk}:beta", "mode": "edit"},
        )
    session = ChatSession.objects.get(owner=user)
    assert chosen["Location"] == f"/sessions/{session.pk}/"
    assert (session.endpoint, session.model_name) == (default, "beta")
    typed = {"text": "Hello", "workspace": workspace.pk, "endpoint": f"{dead.pk}:", "model": "qwen3:8b", "mode": "plan"}
    ada.post("/sessions/new", typed)
    assert ChatSession.objects.filter(endpoint=dead).get().model_name == "qwen3:8b"
    for wrong, message in (("999:x", "There is no model endpoint 999."), ("x", "Choose a model endpoint.")):
        refused = ada.post(
            "/sessions/new", {"text": "Hello", "workspace": workspace.pk, "endpoint": wrong, "mode": "edit"}
        )
        assert refused.status_code == 200 and message in refused.content.decode()
    assert ChatSession.objects.count() == 2


def test_the_model_menu_lists_the_endpoints_with_the_sessions_model_chosen(
    ada: Client, bob: Client, user: Any, workspace: Workspace
) -> None:
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as one:
        listed = ModelEndpoint.objects.create(name="listed", base_url=one.base_url)
        session = session_start(owner=user, workspace=workspace, endpoint=listed, model_name="typed-once", tools=[])
        page = ada.get(f"/sessions/{session.pk}/").content.decode()
        assert 'id="model-control"' in page and f'hx-get="/sessions/{session.pk}/models"' in page
        assert '<span class="model-name">typed-once</span>' in page
        html = ada.get(f"/sessions/{session.pk}/models").content.decode()
        assert bob.get(f"/sessions/{session.pk}/models").status_code == 404
    assert options_of(html, "endpoint") == {
        f"listed · {one.base_url}": [
            (f"{listed.pk}:typed-once", "typed-once", True),
            (f"{listed.pk}:alpha", "alpha", False),
            (f"{listed.pk}:beta", "beta", False),
        ]
    }
    assert "ws-send" in html and '<input type="hidden" name="type" value="model">' in html


def test_the_chat_page_shows_turns_tool_rows_and_the_chart(
    ada: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    chatted(live_session, model)
    response = ada.get(f"/sessions/{live_session.pk}/")
    html = response.content.decode()
    assert "default-src 'self'" in response["Content-Security-Policy"]
    assert f'ws-connect="/ws/sessions/{live_session.pk}/"' in html
    assert 'id="controls" data-state="connecting"' in html  # the websocket's first message enables them
    assert 'id="turn-1"' in html and 'data-status="done"' in html
    assert re.search(r'<code class="rid">#0001</code> <span class="tool-name">read</span>', html)
    assert "— lines 1-30 of 30" in html
    assert f'href="/sessions/{live_session.pk}/results/1/"' in html
    assert '<div class="md reply" hx-disable><p>The notes have <strong>30</strong> lines. &lt;script&gt;' in html
    assert "<script>alert" not in html
    assert html.count('<g class="bar"') == 2
    assert "How long are the notes?" in html
    assert re.search(
        r"Context window: 8,192 tokens, as configured for this endpoint: the server did not state its own when asked "
        r"at \d\d:\d\d UTC\.",
        html,
    ), "the scripted server states no window"


def test_the_chat_page_says_where_the_window_was_read(ada: Client, live_session: ChatSession) -> None:
    endpoint_window_record(
        endpoint=live_session.endpoint,
        url=live_session.endpoint.base_url,
        tokens=32_768,
        how="/v1/models max_model_len",
    )
    html = ada.get(f"/sessions/{live_session.pk}/").content.decode()
    assert re.search(
        r"Context window: 32,768 tokens, read from the server \(/v1/models max_model_len\) at \d\d:\d\d UTC on "
        r"\d{4}-\d\d-\d\d\.",
        html,
    )


def test_a_reply_has_copy_and_its_source_is_the_markdown_as_written(
    ada: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    chatted(live_session, model)
    source_url = f"/sessions/{live_session.pk}/turns/1/source"
    html = ada.get(f"/sessions/{live_session.pk}/").content.decode()
    assert f'class="link copy copy-reply" data-source="{source_url}"' in html
    response = ada.get(source_url)
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.decode() == "Reading.\n\nThe notes have **30** lines. <script>alert(1)</script>"
    assert ada.get(f"/sessions/{live_session.pk}/turns/2/source").status_code == 404


def test_an_open_turn_nobody_replies_to_is_shown_interrupted(ada: Client, live_session: ChatSession) -> None:
    turn_start(session=live_session, words="Hello", today="2026-11-29", instructions=None)
    html = ada.get(f"/sessions/{live_session.pk}/").content.decode()
    assert 'data-status="interrupted"' in html
    assert "The reply stopped when the server running it stopped" in html
    assert 'class="retry"' in html
    assert Turn.objects.get().status == TurnStatus.OPEN, "a page changes nothing; the next reply marks it"


def test_a_session_whose_workspace_its_owner_was_removed_from_reads_but_is_read_only(
    ada: Client, other_user: Any, live_session: ChatSession, model: ScriptedServer
) -> None:
    chatted(live_session, model)
    before = ada.get(f"/sessions/{live_session.pk}/").content.decode()
    assert 'id="composer"' in before and "read-only" not in before
    Workspace.objects.filter(pk=live_session.workspace_id).update(open_to_everyone=False)
    live_session.workspace.members.add(other_user)
    response = ada.get(f"/sessions/{live_session.pk}/")
    html = response.content.decode()
    assert response.status_code == 200
    assert (
        '<p class="read-only-banner" id="read-only" role="alert">You are no longer a member of the workspace “ws”: '
        "this session is read-only.</p>"
    ) in html
    assert '<div class="chat read-only" id="chat"' in html
    for control in ('id="composer"', 'id="controls"', 'id="mode-select"', 'id="model-control"', 'id="toolbar"'):
        assert control not in html, control
    assert "How long are the notes?" in html and "<strong>30</strong>" in html, "the person's own turns show"
    assert re.search(r'<code class="rid">#0001</code> <span class="tool-name">read</span>', html)
    for path in ("/results/1/", "/chart", "/turns/1/", "/turns/1/source", "/export.md", "/export.json"):
        assert ada.get(f"/sessions/{live_session.pk}{path}").status_code == 200, path
    listing = ada.get("/").content.decode()
    assert (
        '<span class="read-only-mark" title="You are no longer a member of this workspace">read-only</span>' in listing
    )
    live_session.workspace.members.add(live_session.owner)
    assert "read-only" not in ada.get("/").content.decode()
    assert 'id="composer"' in ada.get(f"/sessions/{live_session.pk}/").content.decode()


def test_a_session_on_a_folder_now_forbidden_is_read_only(ada: Client, live_session: ChatSession) -> None:
    Workspace.objects.filter(pk=live_session.workspace_id).update(folder="/etc")
    html = ada.get(f"/sessions/{live_session.pk}/").content.decode()
    assert (
        "The workspace “ws” is on a folder Cachet may not use (/etc is a system folder): this session is read-only "
        "until staff change the folder in the admin."
    ) in html
    assert 'id="composer"' not in html


def test_another_user_gets_404_everywhere(bob: Client, live_session: ChatSession, model: ScriptedServer) -> None:
    chatted(live_session, model)
    base = f"/sessions/{live_session.pk}"
    for path in ("/", "/chart", "/results/1/", "/results/2/", "/turns/1/source"):
        assert bob.get(base + path).status_code == 404, path
    assert bob.post(base + "/rename", {"title": "mine"}).status_code == 404
    assert bob.post(base + "/delete").status_code == 404
    live_session.refresh_from_db()
    assert live_session.title == "How long are the notes?"


def test_rename_with_htmx_and_without(ada: Client, chat_session: ChatSession) -> None:
    url = reverse("session_rename", args=[chat_session.pk])
    response = ada.post(url, {"title": "  Plans  "}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert f'id="session-{chat_session.pk}"' in response.content.decode()
    assert ChatSession.objects.get().title == "Plans"
    response = ada.post(url, {"title": "Other"})
    assert response.status_code == 302 and ChatSession.objects.get().title == "Other"
    assert ada.get(url).status_code == 405


def test_posts_need_the_csrf_token(user: Any, chat_session: ChatSession) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(reverse("session_rename", args=[chat_session.pk]), {"title": "x"}).status_code == 403
    assert client.post(reverse("session_delete", args=[chat_session.pk])).status_code == 403
    assert ChatSession.objects.filter(pk=chat_session.pk).exists()


def test_deleting_a_session_hides_it_and_keeps_everything_stored(
    ada: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    chatted(live_session, model)
    url = reverse("session_delete", args=[live_session.pk])
    with reply_lock(live_session):
        busy = ada.post(url)
    assert busy.status_code == 409 and ChatSession.objects.exists()
    response = ada.post(url, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response.content == f'<li id="side-{live_session.pk}" hx-swap-oob="delete"></li>'.encode()
    assert f'id="session-{live_session.pk}"' not in ada.get("/").content.decode()
    for page in (f"/sessions/{live_session.pk}/", f"/sessions/{live_session.pk}/results/1/"):
        assert ada.get(page).status_code == 404, page
    assert ada.get(f"/sessions/{live_session.pk}/export.json").status_code == 404
    assert ada.get("/", {"q": "notes"}).content.decode().count('class="session"') == 0, "nor found by search"
    assert ada.post(url).status_code == 404, "deleted once"
    assert Turn.objects.filter(session=live_session).exists(), "kept whole for the admin"


def test_a_stored_result_is_paged_like_recall(ada: Client, live_session: ChatSession, model: ScriptedServer) -> None:
    chatted(live_session, model)
    url = f"/sessions/{live_session.pk}/results/1/"
    html = ada.get(url).content.decode()
    assert "lines 1-30 of 30" in html and "30: line 30" in html and "#0001" in html
    assert 'id="next-page"' not in html
    html = ada.get(url + "?offset=11&limit=5").content.decode()
    assert "lines 11-15 of 30" in html
    body = re.search(r'<pre class="full-text"[^>]*>(.*?)</pre>', html, re.S)
    assert body is not None and body.group(1) == "\n".join(f"{n}: line {n}" for n in range(11, 16))
    assert '?offset=16&amp;limit=5" id="next-page"' in html and '?offset=6&amp;limit=5" id="previous-page"' in html
    html = ada.get(url + "?offset=1&limit=99999").content.decode()
    assert "lines 1-30 of 30" in html
    html = ada.get(url + "?offset=31").content.decode()
    assert "past the end" in html
    html = ada.get(url + "?offset=x&limit=-3").content.decode()
    assert "lines 1-1 of 30" in html
    assert ada.get(f"/sessions/{live_session.pk}/results/9/").status_code == 404


def test_the_whole_chart_page(ada: Client, live_session: ChatSession, model: ScriptedServer) -> None:
    empty = ada.get(f"/sessions/{live_session.pk}/chart")
    assert empty.status_code == 200 and b"No model requests yet." in empty.content
    chatted(live_session, model)
    html = ada.get(f"/sessions/{live_session.pk}/chart").content.decode()
    assert html.count('<g class="bar"') == 2 and 'data-cause="first"' in html


def test_search_sessions_as_a_page_and_as_htmx_results(
    ada: Client, user: Any, other_user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    mine = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[], title="t")
    turn_start(session=mine, words="Why is the <b>zeppelin</b> flag ignored?", today="2026-11-29", instructions=None)
    theirs = session_start(owner=other_user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[])
    turn_start(session=theirs, words="zeppelin too", today="2026-11-29", instructions=None)
    page = ada.get("/", {"q": "zeppel"}).content.decode()
    assert '<label for="search-q">Search sessions</label>' in page and 'value="zeppel"' in page
    assert f'id="session-{mine.pk}"' in page and f'id="session-{theirs.pk}"' not in page
    assert "&lt;b&gt;<mark>zeppel</mark>in&lt;/b&gt;" in page, "the snippet is escaped, only the marks are markup"
    results = ada.get("/", {"q": "zeppelin", "workspace": "", "model": ""}, headers={"HX-Request": "true"})
    html = results.content.decode()
    assert html.startswith('<div id="session-results">') and "<html" not in html
    assert "1 session matches" in html
    restored = ada.get("/", {"q": "zeppelin"}, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert "<html" in restored.content.decode(), "htmx restoring a page from its history gets the whole page"
    assert "No session matches." in ada.get("/", {"q": "absent"}).content.decode()
    other_model = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="n", tools=[])
    turn_start(session=other_model, words="zeppelin on n", today="2026-11-29", instructions=None)
    by_model = ada.get("/", {"q": "zeppelin", "model": "n"}).content.decode()
    assert f'id="session-{other_model.pk}"' in by_model and f'id="session-{mine.pk}"' not in by_model
    listed = ada.get("/", {"model": "m", "workspace": str(workspace.pk)}).content.decode()
    assert f'id="session-{mine.pk}"' in listed and f'id="session-{other_model.pk}"' not in listed


def test_dark_mode_is_remembered_per_person_and_rendered_on_the_html_element(ada: Client, bob: Client) -> None:
    assert '<html lang="en" data-theme="system">' in ada.get("/").content.decode()
    assert ada.post("/settings/theme", {"theme": "dark"}, headers={"HX-Request": "true"}).status_code == 204
    page = ada.get("/").content.decode()
    assert '<html lang="en" data-theme="dark">' in page
    assert '<option value="dark" selected>On</option>' in page
    assert '<html lang="en" data-theme="system">' in bob.get("/").content.decode(), "Bob's pages are his own"
    response = ada.post("/settings/theme", {"theme": "light", "next": "/sessions/new"})
    assert (response.status_code, response["Location"]) == (302, "/sessions/new")
    assert ada.post("/settings/theme", {"theme": "light", "next": "https://elsewhere.test/"})["Location"] == "/"
    assert '<html lang="en" data-theme="light">' in ada.get("/").content.decode()


def test_a_wrong_dark_mode_value_is_refused_and_changes_nothing(ada: Client) -> None:
    ada.post("/settings/theme", {"theme": "dark"})
    response = ada.post("/settings/theme", {"theme": "purple"})
    assert response.status_code == 400
    assert "system, light, dark" in response.content.decode()
    assert 'data-theme="dark"' in ada.get("/").content.decode()
    assert ada.get("/settings/theme").status_code == 405


def test_the_login_page_follows_the_system(client: Client) -> None:
    assert '<html lang="en" data-theme="system">' in client.get("/login/").content.decode()
    assert client.post("/settings/theme", {"theme": "dark"})["Location"].startswith("/login/")


def test_dark_mode_needs_the_csrf_token(user: Any) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/settings/theme", {"theme": "dark"}).status_code == 403


def test_pinned_sessions_come_first_and_archived_ones_wait_under_archived(
    ada: Client, user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    older, _newer, other = (
        session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[], title=title)
        for title in ("Older", "Newer", "Other")
    )

    def order(html: str) -> list[str]:
        return re.findall(r'<a class="title" href="/sessions/\d+/">([^<]+)</a>', html)

    assert order(ada.get("/").content.decode()) == ["Other", "Newer", "Older"]
    pinned = ada.post(f"/sessions/{older.pk}/pin", {"set": "1"}, headers={"HX-Request": "true"})
    assert order(pinned.content.decode()) == ["Older", "Other", "Newer"], "the list as it now stands"
    archived = ada.post(f"/sessions/{other.pk}/archive", {"set": "1"}, headers={"HX-Request": "true"})
    assert order(archived.content.decode()) == ["Older", "Newer"]
    page = ada.get("/").content.decode()
    assert "Archived sessions (1)" in page and order(page) == ["Older", "Newer"]
    assert order(ada.get("/", {"archived": "1"}).content.decode()) == ["Other"]
    ada.post(f"/sessions/{other.pk}/archive", {"set": "0"})
    ada.post(f"/sessions/{older.pk}/pin", {"set": "0"})
    assert order(ada.get("/").content.decode()) == ["Other", "Newer", "Older"], "back where their time puts them"


def test_the_chart_and_the_list_show_the_sessions_totals(
    ada: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    assert "No requests yet." in ada.get(f"/sessions/{live_session.pk}/").content.decode()
    chatted(live_session, model)
    page = ada.get(f"/sessions/{live_session.pk}/").content.decode()
    assert re.search(
        r'<p id="chart-summary" class="chart-summary">2 requests · [\d,]+ prompt tokens, \d+ % cached', page
    )
    listing = ada.get("/").content.decode()
    brief = r"2 requests, [\d,]+ tokens, \d+ % cached, [\d,]+ processed in [\d.]+ s, the cache saved [\d.]+ s"
    assert re.search(rf'<span class="meta totals"[^>]*>{brief}</span>', listing), "the chart's figures, briefly"


def test_new_chat_stores_the_session_with_its_first_message_and_never_an_empty_one(
    ada: Client, user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    form = {"workspace": workspace.pk, "endpoint": endpoint.pk, "model": "", "mode": "edit"}
    for text in ("", "   \n "):
        refused = ada.post("/sessions/new", {**form, "text": text})
        assert refused.status_code == 200 and "Type a message" in refused.content.decode()
    assert not ChatSession.objects.exists(), "no session without a message"
    kept = ada.post("/sessions/new", {**form, "text": "x" * 200_001}).content.decode()
    assert "a message is at most 200,000" in kept and "x" * 1000 in kept, "the words stay in the box"
    first = ada.post("/sessions/new", {**form, "text": " What is here? "})["Location"]
    second = ada.post("/sessions/new", {**form, "text": "And here?"})["Location"]
    assert first != second, "each New chat is a session of its own"
    session = ChatSession.objects.get(pk=int(first.strip("/").rsplit("/", 1)[1]))
    queued = ProcrastinateJob.objects.filter(status="todo").order_by("id").values_list("args", flat=True)
    assert next((job["session_id"], job["action"]) for job in queued) == (
        session.pk,
        {"kind": "send", "words": "What is here?"},
    ), "the reply is queued with the message, as a tab sends it"
    assert ChatSession.objects.filter(owner=user).count() == 2


def test_the_owner_rates_a_reply_up_or_down_and_takes_it_back_and_staff_see_it(
    ada: Client, bob: Client, admin_client: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    chatted(live_session, model)
    url = f"/sessions/{live_session.pk}/turns/1/rating"
    htmx = {"HX-Request": "true"}

    rated = ada.post(url, {"rating": "up"}, headers=htmx)

    assert rated.status_code == 200
    page = rated.content.decode()
    assert re.search(r'class="link rate rate-up"[^>]*aria-pressed="true"', page)
    assert re.search(r'class="link rate rate-down"[^>]*aria-pressed="false"', page)
    turn = Turn.objects.get(session=live_session, number=1)
    assert turn.rating == "up" and turn.rated_at is not None
    assert 'aria-pressed="true"' in ada.get(f"/sessions/{live_session.pk}/").content.decode(), "kept"
    assert ada.post(url, {"rating": "down"}, headers=htmx).status_code == 200
    assert Turn.objects.get(pk=turn.pk).rating == "down"
    assert ada.post(url, {"rating": "down"}).status_code == 302, "without htmx: back to the page"
    turn.refresh_from_db()
    assert turn.rating == "" and turn.rated_at is None, "pressed again, taken back"
    assert ada.post(url, {"rating": "meh"}).status_code == 400
    assert ada.get(url).status_code == 405
    assert bob.post(url, {"rating": "down"}).status_code == 404, "only the owner"
    assert ada.post(f"/sessions/{live_session.pk}/turns/9/rating", {"rating": "up"}).status_code == 404
    ada.post(url, {"rating": "up"})
    listed = admin_client.get("/admin/sessions_app/turn/?rating__exact=up").content.decode()
    assert "thumbs up" in listed and "How long are the notes?" in listed
    assert (
        "How long are the notes?"
        not in admin_client.get("/admin/sessions_app/turn/?rating__exact=down").content.decode()
    )


def test_a_running_reply_cannot_be_rated(ada: Client, live_session: ChatSession) -> None:
    turn_start(session=live_session, words="Still going", today="2026-12-07", instructions=None)
    assert ada.post(f"/sessions/{live_session.pk}/turns/1/rating", {"rating": "up"}).status_code == 404
