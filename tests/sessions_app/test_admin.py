from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app.hygiene.outcomes import OutputOutcome
from sessions_app.models import ChatSession, Result, Workspace
from sessions_app.services.results import result_insert
from sessions_app.services.turns import turn_start

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


def test_admin_needs_staff(client: Client, user: Any) -> None:
    client.login(username="ada", password="ada-password-1")
    response = client.get(reverse("admin:sessions_app_result_changelist"))
    assert response.status_code == 302


def test_workspaces_show_whether_commands_may_use_the_network(staff: Client, tmp_path: Any) -> None:
    page = staff.get(reverse("admin:sessions_app_workspace_add"))
    assert 'name="allow_network"' in page.content.decode()
    staff.post(
        reverse("admin:sessions_app_workspace_add"),
        {"name": "net", "folder": str(tmp_path), "allow_commands": "on", "allow_network": "on"},
    )
    assert Workspace.objects.get(name="net").allow_network is True
    listing = staff.get(reverse("admin:sessions_app_workspace_changelist"))
    assert "column-allow_network" in listing.content.decode()
