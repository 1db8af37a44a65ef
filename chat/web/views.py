"""The pages a person uses: the session list, a new session, the chat page, a stored result, the chart."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.middleware import HtmxDetails

from chat.actions import Send
from chat.agent.budget import Window, window_of
from chat.agent.endpoints import EndpointModels, endpoints_models
from chat.agent.uploads import UploadRefused
from chat.agent.workspace import session_tools
from chat.web import chart, fragments, queueing
from chat.web.attachments import attach_files, attachments_context, too_large
from chat.web.display import call_target, result_id, result_status, single_turn, transcript_page
from chat.web.forms import (
    ImportForm,
    ModelChangeForm,
    NewSessionForm,
    RenameForm,
    SessionSearchForm,
    SessionSettingsChangeForm,
    ThemeForm,
)
from chat.web.sidebar import sidebar_again
from chat.web.sync import chart_requests
from sessions_app import prompts
from sessions_app.errors import StoreError
from sessions_app.hygiene import count_lines, line_window
from sessions_app.models import ChatSession, Mode, Rating, Theme, Turn, TurnStatus
from sessions_app.selectors.requests import finished_requests
from sessions_app.selectors.search import SEARCH_LIMIT, session_search
from sessions_app.selectors.sessions import (
    endpoint_list,
    result_get,
    session_get,
    session_list,
    session_share_token,
    unusable_workspace_ids,
    workspace_refusal,
)
from sessions_app.selectors.totals import session_totals, with_totals
from sessions_app.services.locks import reply_running
from sessions_app.services.sessions import (
    session_archive,
    session_delete,
    session_pin,
    session_rename,
    session_start,
)
from sessions_app.services.settings import theme_set
from sessions_app.services.turns import turn_rate
from sessions_app.services.workspaces import workspace_private
from sessions_app.text import title_from

CHART_COOKIE = "cachet_chart"  # "folded": the chart is drawn folded to its summary line (look.js sets it)


class HtmxHttpRequest(HttpRequest):
    """A request as ``HtmxMiddleware`` leaves it: ``htmx`` says whether htmx sent it, and how."""

    htmx: HtmxDetails


def _user(request: HttpRequest) -> User:
    user = request.user
    assert isinstance(user, User), "login_required lets only users through"
    return user


def _session(request: HttpRequest, session_id: int) -> ChatSession:
    session = session_get(owner=request.user, session_id=session_id)
    if session is None:
        raise Http404("No such session.")
    return session


def share_link(request: HttpRequest, session: ChatSession) -> str:
    """The session's working read-only link, as a full URL, or ``""``."""
    token = session_share_token(session)
    return request.build_absolute_uri(reverse("shared", args=[token])) if token else ""


def home_context(request: HttpRequest, query: QueryDict | None = None) -> dict[str, Any]:
    """The session list (pinned first; the archived ones alone with ``archived=1``), searched and filtered as
    ``query`` (the query string) asks, and the Import form."""
    query = request.GET if query is None else query
    form = SessionSearchForm(query or None, owner=request.user)
    archived = query.get("archived") == "1"
    listed = with_totals(session_list(owner=request.user).filter(archived=archived)).order_by("-pinned", "-updated_at")
    context: dict[str, Any] = {
        "form": form,
        "searched": False,
        "archived": archived,
        "archived_count": 0 if archived else session_list(owner=request.user).filter(archived=True).count(),
        "import_form": ImportForm(user=request.user),
        "read_only_workspaces": unusable_workspace_ids(owner=request.user),
    }
    if form.filtered:
        data = form.cleaned_data
        sessions = listed
        if data["workspace"] is not None:
            sessions = sessions.filter(workspace_id=data["workspace"])
        if data["model"]:
            sessions = sessions.filter(model_name=data["model"])
        if data["q"].strip():
            context["hits"] = session_search(
                owner=request.user, text=data["q"], workspace_id=data["workspace"], model_name=data["model"]
            )
            context["limit"] = SEARCH_LIMIT
        else:
            context["sessions"] = sessions
        context["searched"] = True
    else:
        context["sessions"] = listed
    return context


def home(request: HtmxHttpRequest) -> HttpResponse:
    """The session list, with the search box: a search shows the best matches with a snippet each. An htmx
    request (the box as one types) gets the results alone. Logged out: the login page, after which a person
    lands on a message box (``LOGIN_REDIRECT_URL``), as a deep link lands on its own page."""
    if not request.user.is_authenticated:
        return redirect(settings.LOGIN_URL)
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    context = home_context(request)
    if request.htmx and not request.htmx.history_restore_request:
        return render(request, "chat/_session_results.html", context)
    return render(request, "chat/home.html", context)


def _endpoints(user: AbstractBaseUser | AnonymousUser) -> list[EndpointModels]:
    return endpoints_models(endpoint_list(user=user))


@login_required
@require_http_methods(["GET", "POST"])
def session_new(request: HttpRequest) -> HttpResponse:
    """New chat: an empty composer with the person's last workspace, model and mode chosen. The session is
    stored with its first message, whose reply is queued at once, so no session is ever left empty."""
    last = session_list(owner=request.user).select_related("workspace").order_by("-created_at").first()
    form = NewSessionForm(request.POST or None, user=request.user, last=last)
    attach_problems: list[str] = []
    if request.method == "POST" and form.is_valid():
        files = request.FILES.getlist("files")
        attach_problems = [problem for file in files if (problem := too_large(file))]
        if not attach_problems:
            try:
                session = new_chat(owner=_user(request), form=form, files=files)
            except UploadRefused as error:
                attach_problems = [f"Nothing was sent: {error} Choose the files again."]
            else:
                words = form.cleaned_data["text"].strip()
                queueing.defer(session.pk, Send(words=words))
                return redirect("session", session_id=session.pk)
    private_refused = ""
    try:
        form.choose_workspace(workspace_private(user=_user(request)))  # made on the person's first use
    except StoreError as error:
        private_refused = str(error)
    form.offer_default(_endpoints(request.user))
    context = {
        "form": form,
        "private_refused": private_refused,
        "max_message_bytes": settings.CACHET_MAX_MESSAGE_BYTES,
        "attach_problems": attach_problems,
    }
    return render(request, "chat/new_session.html", context)


@transaction.atomic
def new_chat(*, owner: User, form: NewSessionForm, files: list[UploadedFile[bytes]]) -> ChatSession:
    """The session New chat (or the API) stores, with the files sent along written into its workspace (a name
    already taken keeps both, nothing is overwritten) and recorded for its first message; a file refused stores
    nothing."""
    workspace = form.cleaned_data["workspace"]
    session = session_start(
        owner=owner,
        workspace=workspace,
        endpoint=form.cleaned_data["endpoint"].endpoint,
        model_name=form.chosen_model(),
        tools=session_tools(workspace),
        mode=form.cleaned_data["mode"],
        title=title_from(form.cleaned_data["text"]),
        instructions=form.chosen_instructions(),
        temperature=form.cleaned_data["temperature"],
        max_tokens=form.cleaned_data["max_tokens"],
    )
    attach_files(session, files, keep_both=True)
    return session


@login_required
@require_GET
def session_models(request: HttpRequest, session_id: int) -> HttpResponse:
    """The session's model menu: every endpoint with the models it lists, the session's own chosen."""
    session = _session(request, session_id)
    form = ModelChangeForm(session=session, found=_endpoints(session.owner))
    return render(request, "chat/_model_choices.html", {"form": form, "session": session})


def window_text(window: Window) -> str:
    """The context window the chart is drawn against, and where it comes from (read, or configured)."""
    return f"Context window: {window.tokens:,} tokens, {window.described}."


@login_required
@require_GET
def session_page(request: HttpRequest, session_id: int) -> HttpResponse:
    """The chat page; read-only, saying why, where its owner may no longer use its workspace."""
    session = _session(request, session_id)
    refused = workspace_refusal(session=session)
    revision = session.revision
    running = reply_running(session)
    requests, more, first_index = chart_requests(session)
    totals = session_totals(session)
    context = {
        "session": session,
        "session_id": session.pk,
        "rev": revision,
        "page": transcript_page(session, running=running),
        "running": running,
        "modes": Mode.choices,
        "chart": fragments.chart_markup(session, requests, more=more, first_index=first_index),
        "summary": chart.summary_text(totals),
        "headline": chart.headline_text(totals),
        "window_text": window_text(window_of(session.endpoint)),
        "ws_path": f"/ws/sessions/{session.pk}/",
        "read_only": str(refused) if refused is not None else "",
        "share_link": request.build_absolute_uri(f"/shared/{token}/")
        if (token := session_share_token(session))
        else "",
        "max_message_bytes": settings.CACHET_MAX_MESSAGE_BYTES,
        "settings_form": SessionSettingsChangeForm(session=session),
        "upload_max_bytes": settings.CACHET_UPLOAD_MAX_BYTES,
        "chart_folded": request.COOKIES.get(CHART_COOKIE) == "folded",
        **attachments_context(session),
    }
    return render(request, "chat/session.html", context)


@login_required
@require_GET
def session_turns(request: HttpRequest, session_id: int) -> HttpResponse:
    """The turns before ``?before=N`` (or the last ones), for a page scrolled up to its oldest turn."""
    session = _session(request, session_id)
    before = request.GET.get("before", "")
    page_of = transcript_page(session, running=reply_running(session), before=int(before) if before.isdigit() else None)
    return render(request, "chat/_transcript.html", {"page": page_of, "session_id": session.pk})


@login_required
@require_GET
def session_turn(request: HttpRequest, session_id: int, number: int) -> HttpResponse:
    """One turn of the session, for a page that could not be sent it whole over the websocket."""
    session = _session(request, session_id)
    turn = Turn.objects.filter(session=session, number=number).first()
    if turn is None:
        raise Http404("No such turn.")
    view = single_turn(turn, running=reply_running(session))
    if request.GET.get("whole"):
        return render(request, "chat/turn_whole.html", {"session": session, "turn": turn, "t": view})
    return render(request, "chat/_turn.html", {"t": view, "session_id": session.pk})


@login_required
@require_POST
def turn_rating_view(request: HtmxHttpRequest, session_id: int, number: int) -> HttpResponse:
    """The owner's thumbs up or down on a reply (pressing the pressed one takes it back), kept for the admin."""
    session = _session(request, session_id)
    if workspace_refusal(session=session) is not None:
        return HttpResponse("This session is read-only.", status=403)
    turn = Turn.objects.filter(session=session, number=number).exclude(status=TurnStatus.OPEN).first()
    if turn is None:
        raise Http404("No such turn, or its reply is still running.")
    rating = request.POST.get("rating", "")
    if rating not in Rating.values:
        return HttpResponse("A rating is up or down.", status=400)
    turn = turn_rate(turn=turn, rating="" if rating == turn.rating else rating)
    if request.htmx:
        return render(request, "chat/_rating.html", {"session_id": session.pk, "n": turn.number, "rating": turn.rating})
    return redirect(reverse("session", args=[session.pk]) + f"#turn-{turn.number}")


@login_required
@require_GET
def session_turn_source(request: HttpRequest, session_id: int, number: int) -> HttpResponse:
    """A reply's markdown as the model wrote it, for its Copy button."""
    session = _session(request, session_id)
    turn = Turn.objects.filter(session=session, number=number).only("reply_text").first()
    if turn is None:
        raise Http404("No such turn.")
    return HttpResponse(turn.reply_text, content_type="text/plain; charset=utf-8")


@login_required
@require_POST
def session_rename_view(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = _session(request, session_id)
    form = RenameForm(request.POST)
    if form.is_valid():
        session = session_rename(session=session, title=form.cleaned_data["title"])
    if _from_sidebar(request):
        response = sidebar_again(request, current=request.POST.get("current", ""))
        if request.POST.get("current") == str(session.pk):  # the page's own session: its heading too
            response.content += render_to_string("chat/_title.html", {"session": session, "oob": True}).encode()
        return response
    if request.htmx:
        return render(request, "chat/_session_item.html", {"session": session})
    return redirect("home")


def _from_sidebar(request: HtmxHttpRequest) -> bool:
    return bool(request.htmx) and request.POST.get("from") == "sidebar"


def _listed_again(request: HtmxHttpRequest, session: ChatSession) -> HttpResponse:
    """After a pin or an archive: the list as the page showed it (its search sent along), or the page."""
    if _from_sidebar(request):
        return sidebar_again(request, current=request.POST.get("current", ""))
    if request.htmx:
        return render(request, "chat/_session_results.html", home_context(request, query=request.POST))
    return redirect("home")


@login_required
@require_POST
def session_pin_view(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = session_pin(session=_session(request, session_id), pinned=request.POST.get("set") == "1")
    return _listed_again(request, session)


@login_required
@require_POST
def session_archive_view(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = session_archive(session=_session(request, session_id), archived=request.POST.get("set") == "1")
    return _listed_again(request, session)


@login_required
@require_POST
def session_delete_view(request: HtmxHttpRequest, session_id: int) -> HttpResponse:
    session = _session(request, session_id)
    if reply_running(session):
        message = "A reply is running in this session; stop it before deleting the session."
        if _from_sidebar(request):
            return sidebar_again(request, current=request.POST.get("current", ""), error=message)
        if request.htmx:
            return render(request, "chat/_session_item.html", {"session": session, "error": message})
        return HttpResponse(message, status=409, content_type="text/plain")
    session_delete(session=session)
    if _from_sidebar(request):
        if request.POST.get("current") == str(session.pk):
            return HttpResponse(status=204, headers={"HX-Redirect": reverse("home")})  # the page shown is gone
        return sidebar_again(request, current=request.POST.get("current", ""))
    if request.htmx:  # the list's row goes; so does the sidebar's, on the same page
        return HttpResponse(f'<li id="side-{session.pk}" hx-swap-oob="delete"></li>')
    return redirect("home")


@login_required
@require_POST
def theme_view(request: HtmxHttpRequest) -> HttpResponse:
    """Remember the person's Dark mode choice; the page that asked (htmx) already shows it."""
    form = ThemeForm(request.POST)
    if not form.is_valid():
        return HttpResponse("Dark mode is one of: system, light, dark.", status=400, content_type="text/plain")
    theme_set(user=_user(request), theme=Theme(form.cleaned_data["theme"]))
    if request.htmx:
        return HttpResponse(status=204)
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect(back)
    return redirect("home")


@login_required
@require_GET
def session_chart(request: HttpRequest, session_id: int) -> HttpResponse:
    """Every request of the session on the chart, where the session page shows the last ones."""
    session = _session(request, session_id)
    requests = list(finished_requests(session=session).select_related("turn").order_by("id"))
    chart = fragments.chart_markup(session, requests, more=0, first_index=1)
    return render(request, "chat/chart.html", {"session": session, "chart": chart})


def _positive(value: str | None, default: int) -> int:
    try:
        number = int(value) if value is not None else default
    except ValueError:
        return default
    return max(1, number)


@login_required
@require_GET
def result_page(request: HttpRequest, session_id: int, number: int) -> HttpResponse:
    """A stored result's full text, a window of lines at a time, as ``recall`` pages it."""
    result = result_get(owner=request.user, session_id=session_id, number=number)
    if result is None:
        raise Http404("No such result.")
    window = prompts.rules_config().recall_window
    offset = _positive(request.GET.get("offset"), 1)
    limit = min(_positive(request.GET.get("limit"), window), window)
    lines = count_lines(result.full_text)
    context: dict[str, Any] = {
        "session": result.session,
        "result": result,
        "rid": result_id(result.number),
        "target": call_target(result.tool, result.arguments_raw),
        "status": result_status(result),
        "offset": offset,
        "limit": limit,
        "lines": lines,
        "total": 0,
        "past_end": bool(lines) and offset > lines,
    }
    if lines and offset <= lines:
        last = min(lines, offset + limit - 1)
        context.update(
            total=lines,
            first=offset,
            last=last,
            body=line_window(result.full_text, offset, last - offset + 1),
            previous_offset=max(1, offset - limit) if offset > 1 else None,
            previous_last=offset - 1,
            next_offset=last + 1 if last < lines else None,
            next_last=min(lines, last + limit),
        )
    return render(request, "chat/result.html", context)
