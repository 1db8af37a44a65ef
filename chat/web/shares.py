"""Read-only links: the owner starts and stops one from the session page; anyone signed in to this Cachet who
has the link sees the session's live branch and its results, with no controls and nothing sent, and can copy what
it shows into a session of their own."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from chat.web.display import transcript_page
from chat.web.views import HtmxHttpRequest, _session, _user, share_link
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_shared
from sessions_app.services.locks import reply_running
from sessions_app.services.shares import CopyRefused, session_copy_shared, share_start, share_stop


def _share_box(request: HttpRequest, session: ChatSession) -> HttpResponse:
    return render(request, "chat/_share.html", {"session": session, "share_link": share_link(request, session)})


@login_required
@require_POST
def share_start_view(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = _session(request, session_id)
    share_start(session=session)
    return _share_box(request, session) if request.htmx else redirect("session", session_id=session.pk)


@login_required
@require_POST
def share_stop_view(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = _session(request, session_id)
    share_stop(session=session)
    return _share_box(request, session) if request.htmx else redirect("session", session_id=session.pk)


def _shared(token: str) -> ChatSession:
    session = session_shared(token=token)
    if session is None:
        raise Http404("This link shows nothing: it was stopped, or never was.")
    return session


@login_required
@require_GET
def shared_page(request: HttpRequest, token: str) -> HttpResponse:
    """The session as its link shows it: the live branch, each result as the model was sent it."""
    return _shared_page(request, _shared(token), token)


def _shared_page(request: HttpRequest, session: ChatSession, token: str, *, copy_error: str = "") -> HttpResponse:
    context = {
        "session": session,
        "session_id": session.pk,
        "shared": token,
        "page": transcript_page(session, running=reply_running(session)),
        "copy_error": copy_error,
    }
    return render(request, "chat/shared.html", context, status=409 if copy_error else 200)


@login_required
@require_POST
def shared_copy(request: HttpRequest, token: str) -> HttpResponse:
    """Copy what the link shows into a new session of the person following it, and open that."""
    session = _shared(token)
    try:
        copied = session_copy_shared(token=token, owner=_user(request))
    except CopyRefused as error:
        return _shared_page(request, session, token, copy_error=str(error))
    return redirect("session", session_id=copied.pk)


@login_required
@require_GET
def shared_turns(request: HttpRequest, token: str) -> HttpResponse:
    """Earlier turns, for a shared page scrolled up to its oldest."""
    session = _shared(token)
    before = request.GET.get("before", "")
    page = transcript_page(session, running=reply_running(session), before=int(before) if before.isdigit() else None)
    return render(request, "chat/_transcript.html", {"page": page, "session_id": session.pk, "shared": token})
