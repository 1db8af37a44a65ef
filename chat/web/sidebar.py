"""The sidebar of every page: New chat, a search, and the person's sessions, newest first (pinned ones on top),
the current one marked. It folds away on a wide screen (a cookie, so the page is drawn folded and never jumps)
and is a drawer on a phone."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from sessions_app.models import ChatSession
from sessions_app.selectors.search import QUERY_CHARS, session_search
from sessions_app.selectors.sessions import session_list

SIDEBAR_SESSIONS = 50
FOLDED_COOKIE = "cachet_sidebar"


@dataclass(frozen=True)
class SidebarList:
    """The sessions the sidebar lists; ``more``: the person has others (the session list shows them all)."""

    sessions: list[ChatSession]
    more: bool = False
    query: str = ""
    archived: int = 0


def sidebar_list(*, owner: AbstractBaseUser | AnonymousUser, query: str = "") -> SidebarList:
    """The owner's sessions for the sidebar: the unarchived ones, pinned first then newest, or the best matches
    of ``query`` (titles, messages and replies, as the session list's search)."""
    if owner.pk is None:
        return SidebarList([])
    query = query.strip()[:QUERY_CHARS]
    if query:
        hits = session_search(owner=owner, text=query)
        return SidebarList([hit.session for hit in hits], query=query)
    listed = session_list(owner=owner).filter(archived=False).order_by("-pinned", "-updated_at")
    sessions = list(listed[: SIDEBAR_SESSIONS + 1])
    archived = session_list(owner=owner).filter(archived=True).count()
    return SidebarList(sessions[:SIDEBAR_SESSIONS], more=len(sessions) > SIDEBAR_SESSIONS, archived=archived)


def sidebar(request: HttpRequest) -> dict[str, object]:
    """The sidebar's sessions, read only where a page draws it (a fragment and an error page do not), and
    whether it is folded."""
    listed: Callable[[], SidebarList | None] = functools.cache(lambda: _listed_or_none(request))
    return {"sidebar": listed, "sidebar_folded": request.COOKIES.get(FOLDED_COOKIE) == "folded"}


def _listed_or_none(request: HttpRequest) -> SidebarList | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    try:
        return sidebar_list(owner=user)
    except DatabaseError:  # a page that says the database is unreachable still draws
        return None


def sidebar_again(request: HttpRequest, *, current: str = "", error: str = "") -> HttpResponse:
    """The sidebar's list as it is now, for a change made from it (``current``: the page's own session)."""
    context = {"sidebar_sessions": sidebar_list(owner=request.user), "current_id": _current(current), "error": error}
    return render(request, "chat/_sidebar_list.html", context)


def _current(value: str) -> int | None:
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else None


@login_required
@require_GET
def sidebar_view(request: HttpRequest) -> HttpResponse:
    """The sidebar's list, searched as ``?q=`` asks (the search box as one types)."""
    listed = sidebar_list(owner=request.user, query=request.GET.get("q", ""))
    context = {"sidebar_sessions": listed, "current_id": _current(request.GET.get("current", ""))}
    return render(request, "chat/_sidebar_list.html", context)
