from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.db.models import Model, ProtectedError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions_app.hygiene.outcomes import OutputOutcome
from sessions_app.models import ChatSession, Generation, McpServer, ModelEndpoint, ModelRequest, Result, Workspace
from sessions_app.services.requests import request_record_cache_check
from sessions_app.services.results import result_insert
from sessions_app.services.turns import step_record, turn_start
from tests.sessions_app.store_kit import request_recorded

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model: Any) -> Client:
    django_user_model.objects.create_superuser(username="root", password="root-password-1", email="")
    client = Client()
    client.login(username="root", password="root-password-1")
    return client


@pytest.fixture
def results(chat_session: ChatSession) -> list[Result]:
    turn = turn_start(session=chat_session, words="go", today="2026-11-29", instructions=None)
    made = []
    for n in range(12):
        body = "\n".join(f"line {i} of output {n}" for i in range(1, 500 if n == 10 else 3))
        made.append(
            result_insert(
                turn=turn,
                step=None,
                call_id=f"c{n}",
                tool="run",
                arguments={"command": "x"},
                arguments_raw="{}",
                outcome=OutputOutcome(text=body),
            )
        )
    return made


def test_result_page_shows_inserted_beside_full_text(staff: Client, results: list[Result]) -> None:
    capped = results[10]
    assert "[199 lines elided, full output #000b]" in capped.inserted_text
    page = staff.get(reverse("admin:sessions_app_result_change", args=[results[10].pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Inserted text (sent to the model)" in html and "Full text (stored)" in html
    assert "line 499 of output 10" in html
    assert "lines elided, full output #000b" in html


def test_search_by_id_and_filters(staff: Client, results: list[Result]) -> None:
    listing = staff.get(reverse("admin:sessions_app_result_changelist"), {"q": "#000a"})
    assert listing.status_code == 200
    assert listing.context["cl"].result_count == 1
    assert listing.context["cl"].result_list[0].number == 10
    by_text = staff.get(reverse("admin:sessions_app_result_changelist"), {"q": '"of output 3"'})
    assert by_text.context["cl"].result_count == 1
    by_tool = staff.get(reverse("admin:sessions_app_result_changelist"), {"tool": "run", "kind": "output"})
    assert by_tool.context["cl"].result_count == 12


def test_stored_results_cannot_be_edited(staff: Client, results: list[Result]) -> None:
    url = reverse("admin:sessions_app_result_change", args=[results[0].pk])
    staff.post(url, {"full_text": "rewritten"})
    results[0].refresh_from_db()
    assert results[0].full_text != "rewritten"
    assert staff.get(reverse("admin:sessions_app_result_add")).status_code == 403


def test_sessions_and_requests_pages_render(staff: Client, results: list[Result], chat_session: ChatSession) -> None:
    assert staff.get(reverse("admin:sessions_app_chatsession_change", args=[chat_session.pk])).status_code == 200
    assert staff.get(reverse("admin:sessions_app_modelrequest_changelist")).status_code == 200
    assert staff.get(reverse("admin:sessions_app_turn_changelist")).status_code == 200
    listing = staff.get(reverse("admin:sessions_app_chatsession_changelist")).content.decode()
    assert all(column in listing for column in ("column-requests", "column-prompt_tokens", "column-cached"))
    assert staff.get(reverse("admin:sessions_app_chatsession_changelist"), {"o": "7"}).status_code == 200


def test_the_sessions_list_shows_the_totals_the_chart_sums_up(staff: Client, chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="Hi", today="2026-12-05", instructions=None)
    recorded, _ = request_recorded(chat_session, turn)
    ModelRequest.objects.filter(pk=recorded.pk).update(
        status="done", prompt_tokens=1000, cached_tokens=800, timings={"prompt_ms": 200.0, "prompt_n": 200}
    )
    listing = staff.get(reverse("admin:sessions_app_chatsession_changelist")).content.decode()
    cells = dict(re.findall(r'<td class="field-(\w+)">([^<]*)</td>', listing))
    assert (cells["requests"], cells["prompt_tokens"], cells["cached"]) == ("1", "1,000", "80%")
    assert (cells["processed"], cells["prompt_time"], cells["cache_saved"]) == ("200", "0.2 s", "0.8 s")


def test_admin_needs_staff(client: Client, user: Any) -> None:
    client.login(username="ada", password="ada-password-1")
    response = client.get(reverse("admin:sessions_app_result_changelist"))
    assert response.status_code == 302


def test_workspaces_show_whether_commands_may_use_the_network(staff: Client, tmp_path: Any, settings: Any) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
    page = staff.get(reverse("admin:sessions_app_workspace_add"))
    assert 'name="allow_network"' in page.content.decode()
    staff.post(
        reverse("admin:sessions_app_workspace_add"),
        {"name": "net", "folder": str(tmp_path), "allow_commands": "on", "allow_network": "on", "disk_quota_mb": "0"},
    )
    assert Workspace.objects.get(name="net").allow_network is True
    listing = staff.get(reverse("admin:sessions_app_workspace_changelist"))
    assert "column-allow_network" in listing.content.decode()


@pytest.fixture
def keeper(django_user_model: Any) -> Client:
    """Staff who may only view and change workspaces: the audit's "change workspace" account."""
    from django.contrib.auth.models import Permission

    person = django_user_model.objects.create_user(username="keeper", password="keeper-password-1", is_staff=True)
    person.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_workspace", "change_workspace", "add_workspace"])
    )
    client = Client()
    client.login(username="keeper", password="keeper-password-1")
    return client


def _errors(response: Any) -> list[str]:
    return [
        html.unescape(error)
        for error in re.findall(r'<ul class="errorlist[^"]*"[^>]*><li>(.*?)</li>', response.content.decode())
    ]


def test_the_admin_refuses_workspace_folders_outside_the_roots_and_cachets_own(
    keeper: Client, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))  # wherever the tests' own Python lies
    root = tmp_path / "roots"
    (root / "team").mkdir(parents=True)
    (root / "to-etc").symlink_to("/etc")
    settings.CACHET_WORKSPACE_ROOTS = [root]
    code, data, venv = Path(settings.BASE_DIR), Path(settings.CACHET_DATA), tmp_path / "venv"
    refused = {
        "/": "/ is the root of the file system",
        "/etc": "/etc is a system folder",
        "/proc/self/root": "/proc/self/root leads to /: / is the root of the file system",
        str(code): f"{code} is Cachet's code",
        str(code / "chat"): f"{code}/chat lies inside Cachet's code ({code})",
        str(data / "pg"): f"{data}/pg lies inside Cachet's data ({data})",
        str(venv / "bin"): f"{venv}/bin lies inside Cachet's virtual environment ({venv})",
        str(tmp_path / "elsewhere"): (
            f"{tmp_path}/elsewhere is not under the workspace roots ({root}); CACHET_WORKSPACE_ROOTS sets them"
        ),
        str(root / "to-etc"): f"{root}/to-etc leads to /etc: /etc is a system folder",
        "team": "'team' is not an absolute path",
    }
    add = reverse("admin:sessions_app_workspace_add")
    for folder, reason in refused.items():
        response = keeper.post(add, {"name": "team", "folder": folder, "allow_commands": "on", "disk_quota_mb": "0"})
        assert response.status_code == 200, folder
        assert _errors(response) == [f"Cachet may not use this folder: {reason}."], folder
    assert not Workspace.objects.exists()
    made = keeper.post(add, {"name": "team", "folder": f"{root}/team/../team", "disk_quota_mb": "0"})
    assert made.status_code == 302
    workspace = Workspace.objects.get(name="team")
    assert workspace.folder == str(root / "team"), "stored resolved"
    change = reverse("admin:sessions_app_workspace_change", args=[workspace.pk])
    moved = keeper.post(change, {"name": "team", "folder": "/", "allow_network": "on", "disk_quota_mb": "0"})
    assert _errors(moved) == ["Cachet may not use this folder: / is the root of the file system."]
    assert Workspace.objects.get(pk=workspace.pk).folder == str(root / "team")
    assert Workspace.objects.get(pk=workspace.pk).allow_network is False


def test_the_admin_takes_the_default_root_inside_the_data_folder(staff: Client, settings: Any) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [Path(settings.CACHET_DATA) / "workspaces"]
    folder = Path(settings.CACHET_DATA).resolve() / "workspaces" / "team"
    add = reverse("admin:sessions_app_workspace_add")
    assert staff.post(add, {"name": "team", "folder": str(folder), "disk_quota_mb": "0"}).status_code == 302
    assert Workspace.objects.get(name="team").folder == str(folder)


@pytest.fixture
def stored(chat_session: ChatSession, results: list[Result]) -> dict[str, Model]:
    """One row of every stored model, a request to a model included."""
    turn = results[0].turn
    step = step_record(turn=turn, number=1, text="t", reasoning="", tool_calls=[], finish_reason="stop")
    request, _ = request_recorded(chat_session, turn, model_name="scripted")
    return {
        "chatsession": chat_session,
        "generation": Generation.objects.get(session=chat_session),
        "turn": turn,
        "step": step,
        "result": results[0],
        "modelrequest": request,
    }


STORED = ["chatsession", "generation", "turn", "step", "result", "modelrequest"]


@pytest.mark.parametrize("name", STORED)
def test_staff_cannot_delete_anything_stored(staff: Client, stored: dict[str, Model], name: str) -> None:
    row = stored[name]
    model = type(row)
    if name == "step":
        assert not admin.site.is_registered(model)  # shown inline in its turn, which deletes nothing
        return
    url = reverse(f"admin:sessions_app_{name}_delete", args=[row.pk])
    assert staff.get(url).status_code == 403
    assert staff.post(url, {"post": "yes"}).status_code == 403
    changelist = reverse(f"admin:sessions_app_{name}_changelist")
    page = staff.get(changelist)
    assert page.status_code == 200
    assert "delete_selected" not in page.content.decode()
    staff.post(changelist, {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"})
    assert model._default_manager.filter(pk=row.pk).exists()


def test_a_requests_page_shows_both_renderings_of_a_template_miss(staff: Client, stored: dict[str, Model]) -> None:
    request = stored["modelrequest"]
    assert isinstance(request, ModelRequest)
    url = reverse("admin:sessions_app_modelrequest_change", args=[request.pk])
    assert "first message rendered differently" in staff.get(url).content.decode().lower()
    request_record_cache_check(
        request=request,
        expected_cached_tokens=300,
        miss="template",
        tokens_lost=120,
        message=2,
        before="<|im_start|>assistant\n<think>\nplan <b>\n</think>",
        after="<|im_start|>assistant\n",
    )
    page = staff.get(url).content.decode()
    assert "Message 2 as the server rendered it for the request before" in page
    assert "plan &lt;b&gt;" in page and "plan <b>" not in page
    listing = staff.get(reverse("admin:sessions_app_modelrequest_changelist") + "?cache_miss=template").content.decode()
    assert "120" in listing


def test_inlines_offer_no_delete(staff: Client, stored: dict[str, Model]) -> None:
    for name in ("chatsession", "turn"):
        page = staff.get(reverse(f"admin:sessions_app_{name}_change", args=[stored[name].pk]))
        assert page.status_code == 200
        assert "-DELETE" not in page.content.decode()


@pytest.mark.parametrize(("name", "link"), [("workspace", "workspace"), ("modelendpoint", "endpoint")])
def test_configuration_a_session_uses_is_kept_with_a_clear_reason(
    staff: Client, chat_session: ChatSession, name: str, link: str
) -> None:
    used = getattr(chat_session, link)
    url = reverse(f"admin:sessions_app_{name}_delete", args=[used.pk])
    page = staff.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert f"Sessions use “{used}”, and sessions are kept, so it cannot be deleted." in html
    assert "protected related objects" in html and "permission" not in html
    assert staff.post(url, {"post": "yes"}).status_code == 200
    assert type(used).objects.filter(pk=used.pk).exists()
    changelist = reverse(f"admin:sessions_app_{name}_changelist")
    staff.post(changelist, {"action": "delete_selected", "_selected_action": [used.pk], "post": "yes"})
    assert type(used).objects.filter(pk=used.pk).exists()


def test_unused_configuration_can_be_deleted(staff: Client, workspace_dir: Path) -> None:
    unused = Workspace.objects.create(name="spare", folder=str(workspace_dir))
    endpoint = ModelEndpoint.objects.create(name="spare", base_url="http://127.0.0.1:9/v1")
    for name, row in (("workspace", unused), ("modelendpoint", endpoint)):
        response = staff.post(reverse(f"admin:sessions_app_{name}_delete", args=[row.pk]), {"post": "yes"})
        assert response.status_code == 302
        assert not type(row).objects.filter(pk=row.pk).exists()


def test_a_person_with_sessions_is_deactivated_not_deleted(
    staff: Client, chat_session: ChatSession, other_user: Any
) -> None:
    owner = chat_session.owner
    with pytest.raises(ProtectedError):
        owner.delete()
    url = reverse("admin:auth_user_delete", args=[owner.pk])
    html = staff.get(url).content.decode()
    assert "The account “ada” has sessions, which are kept, so it cannot be deleted." in html
    assert "Untick Active" in html and "permission" not in html
    staff.post(url, {"post": "yes"})
    assert ChatSession.objects.filter(pk=chat_session.pk, owner=owner).exists()
    response = staff.post(reverse("admin:auth_user_delete", args=[other_user.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not type(other_user).objects.filter(pk=other_user.pk).exists()


def test_a_sessions_page_shows_its_turns_as_a_tree_with_the_live_branch(
    staff: Client, chat_session: ChatSession
) -> None:
    from sessions_app.services.turns import turn_finish
    from sessions_app.services.undo import turn_edit, turn_regenerate

    for words in ("one", "two", "three"):
        turn_finish(turn=turn_start(session=chat_session, words=words, today="2026-11-30", instructions=None))
    turn_finish(turn=turn_edit(session=chat_session, turn=2, words="deux", today="2026-11-30", instructions=None)[1])
    turn_finish(turn=turn_regenerate(session=chat_session)[1])
    html = staff.get(reverse("admin:sessions_app_chatsession_change", args=[chat_session.pk])).content.decode()
    tree = html[html.index('<ul class="cachet-tree">') :]
    tree = tree[: tree.index("</ul></li></ul>") + len("</ul></li></ul>")]
    rows = re.findall(r'<li class="cachet-(turn(?: live)?|fork|branch(?: live)?)">', tree)
    assert rows == [
        "turn live",  # 1
        "fork",
        "branch",
        "turn",  # 2
        "turn",  # 3
        "branch",
        "turn",  # 4, taken back by the regenerate
        "branch live",
        "turn live",  # 5
    ]
    assert '<b>turn 2</b> <span class="cachet-stored">(stored 5)</span> · done · deux' in tree
    assert "(stored 4)</span> · taken back by regenerate · deux" in tree
    assert "(stored 2)</span> · taken back by edit · two" in tree


def test_endpoints_show_the_configured_window_and_the_one_the_server_says(staff: Client) -> None:
    from chat.agent.budget import endpoint_window
    from testing.scripted_server import ScriptedServer

    with ScriptedServer(n_ctx=4096) as small:
        endpoint = ModelEndpoint.objects.create(name="small", base_url=small.base_url, context_window=8192)
        never = ModelEndpoint.objects.create(name="never", base_url="http://127.0.0.1:9/v1", context_window=2048)
        endpoint_window(endpoint)
    listing = staff.get(reverse("admin:sessions_app_modelendpoint_changelist")).content.decode()
    assert re.search(r"4,096 tokens \(asked \d{4}-\d\d-\d\d \d\d:\d\d UTC; llama.cpp /props n_ctx\)", listing)
    page = staff.get(reverse("admin:sessions_app_modelendpoint_change", args=[endpoint.pk])).content.decode()
    assert 'name="context_window" value="8192"' in page
    assert "4,096 tokens (asked" in page
    other = staff.get(reverse("admin:sessions_app_modelendpoint_change", args=[never.pk])).content.decode()
    assert "not asked yet" in other and "2,048 tokens" in other


def test_an_endpoints_api_key_is_never_shown_and_an_empty_field_keeps_it(staff: Client) -> None:
    from django.forms.models import model_to_dict

    from sessions_app.admin import ModelEndpointForm

    endpoint = ModelEndpoint.objects.create(name="keyed", base_url="http://127.0.0.1:9/v1", api_key="sk-secret-123")
    page = staff.get(reverse("admin:sessions_app_modelendpoint_change", args=[endpoint.pk])).content.decode()
    assert "sk-secret-123" not in page and 'type="password"' in page and "Remove the API key" in page
    assert "Cachet administration" in page and "Django administration" not in page

    def saved(**changed: Any) -> str:
        data = {key: value for key, value in model_to_dict(endpoint).items() if value is not None}
        form = ModelEndpointForm(
            data={**data, "api_key": "", **changed}, instance=ModelEndpoint.objects.get(pk=endpoint.pk)
        )
        assert form.is_valid(), form.errors
        return str(form.save().api_key)

    assert saved() == "sk-secret-123", "left empty, the stored key stays"
    assert saved(api_key="sk-new-456") == "sk-new-456"
    assert saved(remove_api_key="on") == ""


def test_the_admin_still_shows_a_session_its_owner_deleted(staff: Client, chat_session: ChatSession) -> None:
    from sessions_app.services.sessions import session_delete

    session_delete(session=chat_session)
    listing = staff.get(reverse("admin:sessions_app_chatsession_changelist"), {"deleted_at__isnull": "False"})
    assert f"/admin/sessions_app/chatsession/{chat_session.pk}/change/" in listing.content.decode()
    page = staff.get(reverse("admin:sessions_app_chatsession_change", args=[chat_session.pk]))
    assert page.status_code == 200


def _staff_who_may(django_user_model: Any, username: str, *codenames: str) -> Client:
    from django.contrib.auth.models import Permission

    person = django_user_model.objects.create_user(username=username, password="staff-password-1", is_staff=True)
    person.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(person)
    return client


def test_an_endpoints_api_key_is_in_no_admin_page_for_any_staff(django_user_model: Any, staff: Client) -> None:
    endpoint = ModelEndpoint.objects.create(name="keyed", base_url="http://127.0.0.1:9/v1", api_key="sk-secret-123")
    keyless = ModelEndpoint.objects.create(name="keyless", base_url="http://127.0.0.1:9/v1")
    viewer = _staff_who_may(django_user_model, "viewer", "view_modelendpoint")
    changer = _staff_who_may(django_user_model, "changer", "view_modelendpoint", "change_modelendpoint")
    change = reverse("admin:sessions_app_modelendpoint_change", args=[endpoint.pk])
    staff.post(change, {"name": "keyed", "base_url": "http://127.0.0.1:9/v1", "context_window": "8192"})
    pages = [
        change,
        reverse("admin:sessions_app_modelendpoint_history", args=[endpoint.pk]),
        reverse("admin:sessions_app_modelendpoint_changelist"),
        reverse("admin:sessions_app_modelendpoint_changelist") + "?q=sk-secret",
        reverse("admin:sessions_app_modelendpoint_delete", args=[endpoint.pk]),
    ]
    for client in (viewer, changer, staff):
        for url in pages:
            response = client.get(url)
            assert response.status_code in (200, 403), (url, response.status_code)
            assert "sk-secret-123" not in response.content.decode(), url
    shown = viewer.get(change).content.decode()
    assert shown.count("sk-") == 0 and 'name="api_key"' not in shown and "Remove the API key" not in shown
    assert re.search(r"<label>API key:</label>\s*<div class=\"readonly\">set</div>", shown), shown
    other = viewer.get(reverse("admin:sessions_app_modelendpoint_change", args=[keyless.pk])).content.decode()
    assert re.search(r"<label>API key:</label>\s*<div class=\"readonly\">none</div>", other)
    editable = changer.get(change).content.decode()
    assert 'type="password"' in editable and "Remove the API key" in editable
    assert re.search(r"<label>API key:</label>\s*<div class=\"readonly\">set</div>", editable)
    assert ModelEndpoint.objects.get(pk=endpoint.pk).api_key == "sk-secret-123"


def test_the_endpoint_list_takes_no_filter_on_the_key(django_user_model: Any, staff: Client) -> None:
    """The audit read a key a letter at a time as view-only staff: ``?api_key__startswith=`` listed the endpoint
    or not. Every lookup on the key is refused alike (400), right or wrong."""
    ModelEndpoint.objects.create(name="keyed", base_url="http://127.0.0.1:9/v1", api_key="sk-live-Q7x9Zk2")
    viewer = _staff_who_may(django_user_model, "viewer", "view_modelendpoint")
    listing = reverse("admin:sessions_app_modelendpoint_changelist")
    for client in (viewer, staff):
        answers = {
            query: client.get(f"{listing}?{query}")
            for query in (
                "api_key__startswith=sk-l",
                "api_key__startswith=zz",
                "api_key=sk-live-Q7x9Zk2",
                "api_key__gt=sk",
                "api_key__regex=^sk",
            )
        }
        assert {query: answer.status_code for query, answer in answers.items()} == dict.fromkeys(answers, 400)
        assert client.get(f"{listing}?name__startswith=ke").status_code == 200


def test_the_default_endpoints_page_says_when_the_environment_sets_its_url(staff: Client, settings: Any) -> None:
    default = ModelEndpoint.objects.create(name="default", base_url="http://127.0.0.1:8080/v1")
    other = ModelEndpoint.objects.create(name="gpu", base_url="http://gpu-box:8080/v1")
    page = reverse("admin:sessions_app_modelendpoint_change", args=[default.pk])
    settings.CACHET_MODEL_URL = ""
    assert "CACHET_MODEL_URL sets" not in staff.get(page).content.decode()
    settings.CACHET_MODEL_URL = "http://127.0.0.1:8080/v1"
    assert "CACHET_MODEL_URL sets this endpoint&#x27;s URL (http://127.0.0.1:8080/v1) at every start" in (
        staff.get(page).content.decode()
    )
    other_page = reverse("admin:sessions_app_modelendpoint_change", args=[other.pk])
    assert "CACHET_MODEL_URL sets" not in staff.get(other_page).content.decode()


def test_staff_add_an_mcp_server_by_url_or_command_and_a_worker_is_asked_to_list_it(
    staff: Client, workspace: Workspace, django_capture_on_commit_callbacks: Any
) -> None:
    from procrastinate.contrib.django.models import ProcrastinateJob

    add = reverse("admin:sessions_app_mcpserver_add")
    fields = {"workspace": workspace.pk, "name": "wiki", "call_timeout": 60, "enabled": "on", "read_only_folders": ""}
    both = staff.post(add, {**fields, "url": "http://wiki:8000/mcp", "command": "wiki-mcp"})
    assert "Give the server&#x27;s URL or its command, one of the two." in both.content.decode()
    bad_name = staff.post(add, {**fields, "name": "Wiki_2", "url": "http://wiki:8000/mcp"})
    assert "Lowercase letters, digits and dashes" in bad_name.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        saved = staff.post(add, {**fields, "url": "http://wiki:8000/mcp", "bearer_token": "tok-secret-9"})
    assert saved.status_code == 302
    server = McpServer.objects.get(name="wiki")
    assert server.bearer_token == "tok-secret-9"
    assert ProcrastinateJob.objects.filter(task_name="cachet.mcp_server_check", args={"server_id": server.pk}).exists()
    page = staff.get(reverse("admin:sessions_app_mcpserver_change", args=[server.pk])).content.decode()
    assert "tok-secret-9" not in page and "not asked yet" in page
    McpServer.objects.filter(pk=server.pk).update(
        tools_json='[{"name": "search", "description": "", "input_schema": {}, "read_only": true}]',
        checked_at=timezone.now(),
    )
    listed = staff.get(reverse("admin:sessions_app_mcpserver_changelist")).content.decode()
    assert "wiki__search (read-only)" in listed
