from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from chat.web.sidebar import SIDEBAR_SESSIONS, sidebar_list
from sessions_app.models import ChatSession, ModelEndpoint, Workspace
from sessions_app.services.sessions import session_archive, session_delete, session_pin, session_start
from sessions_app.services.turns import turn_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


def start(user: Any, workspace: Workspace, endpoint: ModelEndpoint, title: str) -> ChatSession:
    return session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[], title=title)


def listed(html: str) -> list[str]:
    return re.findall(r'<li class="side-item[^"]*" id="side-(\d+)">', html)


def test_every_page_lists_ones_own_sessions_pinned_then_newest_with_the_current_one_marked(
    ada: Client, user: Any, other_user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    older, newer = start(user, workspace, endpoint, "Older"), start(user, workspace, endpoint, "Newer")
    pinned = start(user, workspace, endpoint, "Pinned")
    session_pin(session=pinned, pinned=True)
    session_archive(session=start(user, workspace, endpoint, "Archived"), archived=True)
    session_delete(session=start(user, workspace, endpoint, "Deleted"))
    start(other_user, workspace, endpoint, "Bob's own")
    newer.save(update_fields=["updated_at"])  # changed last: listed first after the pinned one
    for page in ("/", "/sessions/new", f"/sessions/{older.pk}/"):
        html = ada.get(page).content.decode()
        assert listed(html) == [str(pinned.pk), str(newer.pk), str(older.pk)], page
        assert "Bob&#x27;s own" not in html and "Archived (1)" in html
    page = ada.get(f"/sessions/{older.pk}/").content.decode()
    assert f'<li class="side-item current" id="side-{older.pk}">' in page
    assert page.count('aria-current="page"') == 1


def test_the_sidebar_lists_the_latest_and_says_there_are_more(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    for number in range(SIDEBAR_SESSIONS + 1):
        start(user, workspace, endpoint, f"Session {number}")
    shown = sidebar_list(owner=user)
    assert len(shown.sessions) == SIDEBAR_SESSIONS and shown.more
    assert shown.sessions[0].title == f"Session {SIDEBAR_SESSIONS}"


def test_the_search_box_narrows_the_list_to_ones_own_matches(
    ada: Client, user: Any, other_user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    notes = start(user, workspace, endpoint, "Reading")
    turn_start(session=notes, words="How many lines do the notes have?", today="2026-12-05", instructions=None)
    start(user, workspace, endpoint, "Other")
    start(other_user, workspace, endpoint, "Bob reads the notes")
    html = ada.get("/sessions/sidebar", {"q": "notes", "current": str(notes.pk)}).content.decode()
    assert listed(html) == [str(notes.pk)] and "Best matches for “notes”" in html
    assert f'<li class="side-item current" id="side-{notes.pk}">' in html
    assert "No session matches “zebra”." in ada.get("/sessions/sidebar", {"q": "zebra"}).content.decode()
    assert len(listed(ada.get("/sessions/sidebar", {"current": "x" * 30}).content.decode())) == 2


def test_changes_made_from_the_sidebar_redraw_it(
    ada: Client, user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    first, second = start(user, workspace, endpoint, "First"), start(user, workspace, endpoint, "Second")
    htmx = {"HX-Request": "true"}
    sidebar = {"from": "sidebar", "current": str(second.pk)}
    pinned = ada.post(f"/sessions/{first.pk}/pin", {**sidebar, "set": "1"}, headers=htmx).content.decode()
    assert pinned.startswith('<nav class="sidebar-list"') and listed(pinned) == [str(first.pk), str(second.pk)]
    renamed = ada.post(f"/sessions/{first.pk}/rename", {**sidebar, "title": "Renamed"}, headers=htmx).content.decode()
    assert "Renamed" in renamed and f'<li class="side-item current" id="side-{second.pk}">' in renamed
    assert 'id="session-title"' not in renamed, "another session than the page's: its heading is not on the page"
    own = ada.post(f"/sessions/{second.pk}/rename", {**sidebar, "title": "Mine now"}, headers=htmx).content.decode()
    assert own.endswith('<h1 id="session-title" title="Mine now" hx-swap-oob="true">Mine now</h1>\n'), (
        "the open session's heading too"
    )
    archived = ada.post(f"/sessions/{first.pk}/archive", {**sidebar, "set": "1"}, headers=htmx).content.decode()
    assert listed(archived) == [str(second.pk)]
    gone = ada.post(f"/sessions/{second.pk}/delete", sidebar, headers=htmx)
    assert gone.status_code == 204 and gone["HX-Redirect"] == "/", "the page on the screen is gone: to the list"
    assert ChatSession.objects.get(pk=second.pk).deleted_at is not None


def test_a_folded_sidebar_is_drawn_folded_so_the_page_never_jumps(ada: Client) -> None:
    ada.cookies["cachet_sidebar"] = "folded"
    html = ada.get("/").content.decode()
    assert '<html lang="en" data-theme="system" class="sidebar-folded">' in html
    assert 'aria-expanded="false"' in html
